//! The Python boundary (module `specdec_rs._core`): NumPy arrays in, zero-copy,
//! GIL released around the work, `SpecError` out as `ValueError`, Ctrl-C
//! honoured during long simulations.
//!
//! Over 400 lines on purpose: the one file that touches PyO3 (house style), one thin
//! wrapper per function.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndarray::Array2;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray, PyReadonlyArray1, PyReadonlyArray2,
    PyReadonlyArray3, PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::error::SpecError;
use crate::names::Named;
use crate::prob::Prob;
use crate::sim::{Chain, Sim, TreeSim, Variant};
use crate::tree::{Children, Topology, TreeRule};
use crate::verify::{Checks, Method};

impl From<SpecError> for PyErr {
    fn from(e: SpecError) -> PyErr {
        PyValueError::new_err(e.to_string())
    }
}

/// Most threads a call may ask for (the Python wrappers enforce it too).
const MAX_THREADS: usize = 256;
/// Thread pools kept for reuse, most recent first: building one per call
/// costs milliseconds per thread.
const POOLS_KEPT: usize = 4;

/// A pool of `n` threads, reused across calls.
fn pool(n: usize) -> crate::Result<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(Vec::new());
    if n == 0 || n > MAX_THREADS {
        return Err(SpecError::Invalid(format!(
            "threads = {n}; expected 1 <= threads <= {MAX_THREADS}, or None for one per core"
        )));
    }
    let mut pools = POOLS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(i) = pools.iter().position(|(size, _)| *size == n) {
        let entry = pools.remove(i);
        pools.insert(0, entry);
        return Ok(pools[0].1.clone());
    }
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| SpecError::Invalid(format!("cannot start {n} threads: {e}")))?;
    pools.insert(0, (n, Arc::new(built)));
    pools.truncate(POOLS_KEPT);
    Ok(pools[0].1.clone())
}

/// Run `f` on a pool of `threads` threads, or on rayon's global pool.
fn in_pool<T: Send>(threads: Option<usize>, f: impl FnOnce() -> crate::Result<T> + Send) -> crate::Result<T> {
    match threads {
        None => f(),
        Some(n) => pool(n)?.install(f),
    }
}

/// Run `work` with the GIL released on a helper thread while the calling
/// thread checks for signals every 50 ms. On Ctrl-C (or any signal handler
/// that raises) `stop` is set, the work ends at its next check, and the
/// handler's exception (KeyboardInterrupt) is raised. The result comes back
/// through a channel, so the caller wakes the moment it is ready.
fn interruptible<T: Send>(
    py: Python<'_>,
    threads: Option<usize>,
    work: impl FnOnce(&AtomicBool) -> crate::Result<T> + Send,
) -> PyResult<T> {
    let stop = AtomicBool::new(false);
    let mut raised: Option<PyErr> = None;
    let received = py.detach(|| {
        std::thread::scope(|scope| {
            let stop = &stop;
            let (done, result) = mpsc::channel();
            let worker = scope.spawn(move || {
                // a send fails only if the receiver is gone, which it never is here
                let _ = done.send(in_pool(threads, || work(stop)));
            });
            let out = loop {
                match result.recv_timeout(Duration::from_millis(50)) {
                    Ok(out) => break Some(out),
                    Err(RecvTimeoutError::Disconnected) => break None, // the worker panicked
                    Err(RecvTimeoutError::Timeout) => {
                        if raised.is_none() {
                            if let Err(e) = Python::attach(|py| py.check_signals()) {
                                raised = Some(e);
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            };
            let _ = worker.join(); // a panic is reported below, not re-raised by the scope
            out
        })
    });
    if let Some(e) = raised {
        return Err(e);
    }
    match received {
        Some(out) => Ok(out?),
        None => Err(PyRuntimeError::new_err("internal error: a worker thread panicked")),
    }
}

fn dtype_error(what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what} must be C-contiguous float32 or float64 NumPy arrays; \
         use specdec_rs.verify, which converts torch tensors and lists"
    ))
}

/// Call `$typed::<P, Q>(args)` for each (P, Q) in f32/f64 × f32/f64 until one
/// matches the arrays' dtypes (`Some`); otherwise the dtype error for `$what`.
macro_rules! dispatch_dtypes {
    ($typed:ident($($arg:expr),*), $what:expr) => {{
        if let Some(out) = $typed::<f32, f32>($($arg),*)? {
            Ok(out)
        } else if let Some(out) = $typed::<f64, f64>($($arg),*)? {
            Ok(out)
        } else if let Some(out) = $typed::<f32, f64>($($arg),*)? {
            Ok(out)
        } else if let Some(out) = $typed::<f64, f32>($($arg),*)? {
            Ok(out)
        } else {
            Err(dtype_error($what))
        }
    }};
}

/// The row checks of a call: `full`, and each array's tolerance (the
/// element type's default when not given).
fn checks<P: Prob, Q: Prob>(full: bool, p_tol: Option<f64>, q_tol: Option<f64>) -> Checks {
    let default = Checks::of::<P, Q>(full);
    Checks {
        full,
        p_tol: p_tol.unwrap_or(default.p_tol),
        q_tol: q_tol.unwrap_or(default.q_tol),
    }
}

#[allow(clippy::too_many_arguments)]
fn verify_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    drafts: &PyReadonlyArray1<'_, i64>,
    seed: u64,
    full: bool,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
    method: Method,
) -> PyResult<Option<Py<PyArray1<i64>>>> {
    let (Ok(p), Ok(q)) = (p.extract::<PyReadonlyArray2<P>>(), q.extract::<PyReadonlyArray2<Q>>()) else {
        return Ok(None);
    };
    let (pv, qv, dv) = (p.as_array(), q.as_array(), drafts.as_array());
    let checks = checks::<P, Q>(full, p_tol, q_tol);
    let out = py.detach(|| crate::verify::verify(pv, qv, dv, seed, checks, method))?;
    Ok(Some(out.into_pyarray(py).unbind()))
}

/// One speculative round; see `specdec_rs.verify`.
#[pyfunction]
#[pyo3(signature = (p_rows, q_rows, drafts, seed, full=true, p_tol=None, q_tol=None, method="token"))]
#[allow(clippy::too_many_arguments)]
fn verify(
    py: Python<'_>,
    p_rows: &Bound<'_, PyAny>,
    q_rows: &Bound<'_, PyAny>,
    drafts: PyReadonlyArray1<'_, i64>,
    seed: u64,
    full: bool,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
    method: &str,
) -> PyResult<Py<PyArray1<i64>>> {
    let method: Method = method.parse()?;
    dispatch_dtypes!(
        verify_typed(py, p_rows, q_rows, &drafts, seed, full, p_tol, q_tol, method),
        "p_rows and q_rows"
    )
}

type BatchOut = (Py<PyArray2<i64>>, Py<PyArray1<i64>>);

#[allow(clippy::too_many_arguments)]
fn batch_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    drafts: &PyReadonlyArray2<'_, i64>,
    seed: u64,
    full: bool,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
    threads: Option<usize>,
    method: Method,
) -> PyResult<Option<BatchOut>> {
    let (Ok(p), Ok(q)) = (p.extract::<PyReadonlyArray3<P>>(), q.extract::<PyReadonlyArray3<Q>>()) else {
        return Ok(None);
    };
    let (pv, qv, dv) = (p.as_array(), q.as_array(), drafts.as_array());
    let checks = checks::<P, Q>(full, p_tol, q_tol);
    let batch = py.detach(|| {
        in_pool(threads, || {
            crate::verify::verify_batch(pv, qv, dv, seed, checks, method)
        })
    })?;
    let rows = batch.num_emitted.len();
    let tokens =
        Array2::from_shape_vec((rows, batch.width), batch.tokens).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(Some((
        tokens.into_pyarray(py).unbind(),
        batch.num_emitted.into_pyarray(py).unbind(),
    )))
}

/// B independent rounds; see `specdec_rs.verify_batch`.
#[pyfunction]
#[pyo3(signature = (p, q, drafts, seed, full=true, p_tol=None, q_tol=None, threads=None, method="token"))]
#[allow(clippy::too_many_arguments)]
fn verify_batch(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    drafts: PyReadonlyArray2<'_, i64>,
    seed: u64,
    full: bool,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
    threads: Option<usize>,
    method: &str,
) -> PyResult<BatchOut> {
    let method: Method = method.parse()?;
    dispatch_dtypes!(
        batch_typed(py, p, q, &drafts, seed, full, p_tol, q_tol, threads, method),
        "p and q"
    )
}

type TreeOut = (Py<PyArray1<i64>>, Py<PyArray1<i64>>);

#[allow(clippy::too_many_arguments)]
fn tree_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    tokens: &PyReadonlyArray1<'_, i64>,
    parents: &PyReadonlyArray1<'_, i64>,
    seed: u64,
    children: Children,
    checks_of: (bool, Option<f64>, Option<f64>),
) -> PyResult<Option<TreeOut>> {
    let (Ok(p), Ok(q)) = (p.extract::<PyReadonlyArray2<P>>(), q.extract::<PyReadonlyArray2<Q>>()) else {
        return Ok(None);
    };
    let (pv, qv, tv, pa) = (p.as_array(), q.as_array(), tokens.as_array(), parents.as_array());
    let checks = checks::<P, Q>(checks_of.0, checks_of.1, checks_of.2);
    let walk = py.detach(|| crate::tree::verify_tree(pv, qv, tv, pa, seed, children, checks))?;
    let nodes: Vec<i64> = walk.nodes.iter().map(|&i| i as i64).collect();
    Ok(Some((
        walk.tokens.into_pyarray(py).unbind(),
        nodes.into_pyarray(py).unbind(),
    )))
}

/// One draft tree's round; see `specdec_rs.verify_tree`.
#[pyfunction]
#[pyo3(signature = (p_rows, q_rows, tokens, parents, seed, children="iid", full=false, p_tol=None, q_tol=None))]
#[allow(clippy::too_many_arguments)]
fn verify_tree(
    py: Python<'_>,
    p_rows: &Bound<'_, PyAny>,
    q_rows: &Bound<'_, PyAny>,
    tokens: PyReadonlyArray1<'_, i64>,
    parents: PyReadonlyArray1<'_, i64>,
    seed: u64,
    children: &str,
    full: bool,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
) -> PyResult<TreeOut> {
    let children: Children = children.parse()?;
    let checks_of = (full, p_tol, q_tol);
    dispatch_dtypes!(
        tree_typed(py, p_rows, q_rows, &tokens, &parents, seed, children, checks_of),
        "p_rows and q_rows"
    )
}

fn chain(
    p_table: &PyReadonlyArray2<'_, f64>,
    q_table: &PyReadonlyArray2<'_, f64>,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
) -> PyResult<Chain> {
    if !p_table.is_c_contiguous() || !q_table.is_c_contiguous() {
        return Err(dtype_error("p_table and q_table"));
    }
    let tol = f64::SUM_TOL;
    Ok(Chain::new(
        p_table.as_array(),
        q_table.as_array(),
        p_tol.unwrap_or(tol),
        q_tol.unwrap_or(tol),
    )?)
}

/// The rounds a simulation repeats: a chain of k drafts or a tree.
enum Rounds {
    Chain(Sim),
    Tree(TreeSim),
}

/// One Monte Carlo setup, checked once when built: the toy tables, the start
/// token, the seed and the rounds (a chain of `k` drafts with `variant`, or,
/// with `parents`, trees of that shape whose children are drawn as
/// `children` says, walked by the tree `variant`). `histogram` and
/// `round_lengths` run it; see `specdec_rs.sim`.
#[pyclass(frozen, module = "specdec_rs._core")]
struct Simulation {
    chain: Chain,
    rounds: Rounds,
}

#[pymethods]
impl Simulation {
    #[new]
    #[pyo3(signature = (p_table, q_table, *, start, seed, variant="exact", k=None, parents=None, children="iid", p_tol=None, q_tol=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        p_table: PyReadonlyArray2<'_, f64>,
        q_table: PyReadonlyArray2<'_, f64>,
        start: usize,
        seed: u64,
        variant: &str,
        k: Option<usize>,
        parents: Option<PyReadonlyArray1<'_, i64>>,
        children: &str,
        p_tol: Option<f64>,
        q_tol: Option<f64>,
    ) -> PyResult<Self> {
        let chain = chain(&p_table, &q_table, p_tol, q_tol)?;
        let rounds = match (k, parents) {
            (Some(k), None) => Rounds::Chain(Sim {
                variant: variant.parse()?,
                k,
                start,
                seed,
            }),
            (None, Some(parents)) => {
                let parents: Vec<i64> = parents.as_array().iter().copied().collect();
                Rounds::Tree(TreeSim {
                    topo: Topology::new(&parents)?,
                    kind: children.parse()?,
                    rule: variant.parse::<TreeRule>()?,
                    start,
                    seed,
                })
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give k (chain rounds) or parents (tree rounds), not both",
                ))
            }
        };
        match &rounds {
            Rounds::Chain(sim) => crate::sim::Rounds::check(sim, &chain)?,
            Rounds::Tree(sim) => crate::sim::Rounds::check(sim, &chain)?,
        }
        Ok(Simulation { chain, rounds })
    }

    /// Joint histogram (flat) of the first `num_tokens` tokens over `runs` runs.
    #[pyo3(signature = (runs, num_tokens, threads=None))]
    fn histogram(
        &self,
        py: Python<'_>,
        runs: u64,
        num_tokens: usize,
        threads: Option<usize>,
    ) -> PyResult<Py<PyArray1<i64>>> {
        let hist = interruptible(py, threads, |stop| match &self.rounds {
            Rounds::Chain(sim) => crate::sim::simulate(&self.chain, sim, runs, num_tokens, stop),
            Rounds::Tree(sim) => crate::sim::simulate(&self.chain, sim, runs, num_tokens, stop),
        })?;
        Ok(hist.into_pyarray(py).unbind())
    }

    /// Counts of `rounds` rounds by tokens emitted.
    #[pyo3(signature = (rounds, threads=None))]
    fn round_lengths(&self, py: Python<'_>, rounds: u64, threads: Option<usize>) -> PyResult<Py<PyArray1<i64>>> {
        let counts = interruptible(py, threads, |stop| match &self.rounds {
            Rounds::Chain(sim) => crate::sim::simulate_round_lengths(&self.chain, sim, rounds, stop),
            Rounds::Tree(sim) => crate::sim::simulate_round_lengths(&self.chain, sim, rounds, stop),
        })?;
        Ok(counts.into_pyarray(py).unbind())
    }
}

/// Token ids from Python ints: each in [0, 2^32), else a ValueError naming `what`.
fn token_ids(values: Vec<i64>, what: &str) -> PyResult<Vec<u32>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            u32::try_from(v).map_err(|_| {
                PyValueError::new_err(format!(
                    "{what}[{i}] = {v} is not a token id; expected an integer in [0, 2^32)"
                ))
            })
        })
        .collect()
}

/// The suffix drafter's index: a bounded-depth suffix trie of counts
/// (`rust/suffix.rs`); node ids are ints, 0 the root. See
/// `specdec_rs.drafters.suffix.SuffixIndex`, its Python face.
#[pyclass(module = "specdec_rs._core")]
struct SuffixTrie {
    trie: crate::suffix::SuffixTrie,
}

#[pymethods]
impl SuffixTrie {
    #[new]
    fn new(depth: usize) -> PyResult<Self> {
        Ok(SuffixTrie {
            trie: crate::suffix::SuffixTrie::new(depth)?,
        })
    }

    #[getter]
    fn depth(&self) -> usize {
        self.trie.depth()
    }

    fn __len__(&self) -> usize {
        self.trie.len()
    }

    fn grow(&mut self, suffixes: Vec<u32>, tokens: Vec<i64>) -> PyResult<Vec<u32>> {
        let tokens = token_ids(tokens, "tokens")?;
        Ok(self.trie.grow(&suffixes, &tokens)?)
    }

    fn remove(&mut self, tokens: Vec<i64>) -> PyResult<()> {
        let tokens = token_ids(tokens, "tokens")?;
        self.trie.remove(&tokens);
        Ok(())
    }

    fn find(&self, pattern: Vec<i64>) -> PyResult<Option<u32>> {
        Ok(token_ids(pattern, "pattern")
            .map(|p| self.trie.find(&p))
            .unwrap_or(None))
    }

    fn longest_match(&self, seq: Vec<i64>, max_match: usize) -> PyResult<(Option<u32>, usize)> {
        let seq = token_ids(seq, "seq")?;
        Ok(self.trie.longest_match(&seq, max_match))
    }

    fn chain(&self, node: u32, limit: usize, min_prob: f64) -> PyResult<(Vec<u32>, Vec<f64>)> {
        Ok(self.trie.chain(node, limit, min_prob)?)
    }

    fn tree(&self, node: u32, limit: usize, budget: usize, min_prob: f64) -> PyResult<(Vec<u32>, Vec<i64>)> {
        Ok(self.trie.tree(node, limit, budget, min_prob)?)
    }

    fn count(&self, node: u32) -> PyResult<u32> {
        Ok(self.trie.count(node)?)
    }

    fn total(&self, node: u32) -> PyResult<u32> {
        Ok(self.trie.total(node)?)
    }

    fn best(&self, node: u32) -> PyResult<Option<u32>> {
        Ok(self.trie.best(node)?)
    }

    fn children(&self, node: u32) -> PyResult<Vec<(u32, u32)>> {
        Ok(self.trie.children(node)?)
    }
}

/// Phase 1 of a round from gathered values; see `specdec_rs.verify_gathered`.
#[pyfunction]
fn accept_gathered(px: PyReadonlyArray1<'_, f64>, qx: PyReadonlyArray1<'_, f64>, seed: u64) -> PyResult<usize> {
    Ok(crate::verify::accept_gathered(px.as_array(), qx.as_array(), seed)?)
}

#[allow(clippy::too_many_arguments)]
fn finish_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
    py: Python<'_>,
    p_row: &Bound<'_, PyAny>,
    q_row: &Bound<'_, PyAny>,
    m: usize,
    k: usize,
    seed: u64,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
) -> PyResult<Option<i64>> {
    let (Ok(p), Ok(q)) = (
        p_row.extract::<PyReadonlyArray1<P>>(),
        q_row.extract::<PyReadonlyArray1<Q>>(),
    ) else {
        return Ok(None);
    };
    let (pv, qv) = (p.as_array(), q.as_array());
    let checks = checks::<P, Q>(false, p_tol, q_tol);
    Ok(Some(
        py.detach(|| crate::verify::finish_round(pv, qv, m, k, seed, checks))?,
    ))
}

/// Phase 2 of a round: its last token; see `specdec_rs.verify_gathered`.
#[pyfunction]
#[pyo3(signature = (p_row, q_row, m, k, seed, p_tol=None, q_tol=None))]
#[allow(clippy::too_many_arguments)]
fn finish_round(
    py: Python<'_>,
    p_row: &Bound<'_, PyAny>,
    q_row: &Bound<'_, PyAny>,
    m: usize,
    k: usize,
    seed: u64,
    p_tol: Option<f64>,
    q_tol: Option<f64>,
) -> PyResult<i64> {
    dispatch_dtypes!(
        finish_typed(py, p_row, q_row, m, k, seed, p_tol, q_tol),
        "p_row and q_row"
    )
}

/// `out = x · wᵀ` in f32 for C-contiguous `x` (n, k), `w` (m, k) and a
/// writable `out` (n, m), on the calling thread with the GIL released. See
/// `linear.rs`: built for a few rows against a large weight.
#[pyfunction]
fn linear_f32(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, f32>,
    w: PyReadonlyArray2<'_, f32>,
    mut out: PyReadwriteArray2<'_, f32>,
) -> PyResult<()> {
    let (n, k) = (x.shape()[0], x.shape()[1]);
    let m = w.shape()[0];
    if w.shape()[1] != k || out.shape() != [n, m] {
        return Err(PyValueError::new_err(format!(
            "linear_f32: x is {:?}, w {:?} and out {:?}; expected x (n, k), w (m, k) and out (n, m)",
            x.shape(),
            w.shape(),
            out.shape()
        )));
    }
    // `as_slice` takes Fortran order too, which would be read as the transpose
    let contiguous =
        || PyValueError::new_err("linear_f32: x, w and out must be C-contiguous (pass np.ascontiguousarray(...))");
    if !(x.is_c_contiguous() && w.is_c_contiguous() && out.is_c_contiguous()) {
        return Err(contiguous());
    }
    let (xs, ws) = (
        x.as_slice().map_err(|_| contiguous())?,
        w.as_slice().map_err(|_| contiguous())?,
    );
    let os = out.as_slice_mut().map_err(|_| contiguous())?;
    py.detach(|| crate::linear::linear(xs, ws, os, n, k, m))?;
    Ok(())
}

fn qtype_of(id: u32) -> PyResult<crate::quant::QType> {
    crate::quant::QType::from_ggml(id).ok_or_else(|| {
        PyValueError::new_err(format!(
            "ggml type {id} has no native kernel; expected F32 (0), F16 (1), Q4_0 (2), Q4_1 (3), \
             Q5_0 (6), Q5_1 (7), Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14) or BF16 (30)"
        ))
    })
}

fn c_slice<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a PyReadonlyArray<'_, T, D>,
    what: &str,
) -> PyResult<&'a [T]> {
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{what} must be C-contiguous (pass np.ascontiguousarray(...))"
        )));
    }
    a.as_slice()
        .map_err(|_| PyValueError::new_err(format!("{what} must be C-contiguous")))
}

fn path_of(path: Option<&str>) -> PyResult<crate::quant::Path> {
    match path {
        None => Ok(crate::quant::best_path()),
        Some(name) => crate::quant::Path::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = crate::quant::Path::all().iter().map(|p| p.name()).collect();
            PyValueError::new_err(format!("path = {name:?}; expected one of {}", names.join(", ")))
        }),
    }
}

fn act_of(activations: &str) -> PyResult<crate::quant::Act> {
    crate::quant::Act::from_name(activations).ok_or_else(|| {
        PyValueError::new_err(format!(
            "activations = {activations:?}; expected 'f32' (float32, the reference) or 'q8' (ggml's 8-bit blocks)"
        ))
    })
}

/// A row-major weight `w` (m, row bytes) of ggml type `qtype` and row
/// length k in the kernel's packed layout (`quant.rs`: panels of 16 rows in stripes of 4),
/// as a 1-D uint8 array.
#[pyfunction]
fn pack_weight<'py>(
    py: Python<'py>,
    w: PyReadonlyArray2<'py, u8>,
    qtype: u32,
    k: usize,
) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let q = qtype_of(qtype)?;
    let rb = q.row_bytes(k)?;
    if w.shape()[1] != rb {
        return Err(PyValueError::new_err(format!(
            "pack_weight: w is {:?}; expected (m, {rb}): rows of k = {k} {} values",
            w.shape(),
            q.name()
        )));
    }
    let m = w.shape()[0];
    let ws = c_slice(&w, "pack_weight: w")?;
    let packed = py.detach(|| crate::quant::pack(ws, q, m, k))?;
    Ok(packed.into_pyarray(py))
}

/// `out = x · dequant(W)ᵀ` for float32 `x` (n, k), a packed weight
/// (`pack_weight`) of m rows of ggml type `qtype`, and a writable float32
/// `out` (n, m), on `threads` threads with the GIL released, on the
/// instruction `path` (`quant.rs`'s names; None: the best this CPU runs),
/// with `activations` "f32" or "q8" (`quant.rs`: one fixed order per output
/// in each, the same bits on every path).
#[pyfunction]
#[pyo3(signature = (x, packed, qtype, m, out, threads, path=None, activations="f32"))]
#[allow(clippy::too_many_arguments)]
fn qlinear(
    py: Python<'_>,
    x: PyReadonlyArray2<'_, f32>,
    packed: PyReadonlyArray1<'_, u8>,
    qtype: u32,
    m: usize,
    mut out: PyReadwriteArray2<'_, f32>,
    threads: usize,
    path: Option<&str>,
    activations: &str,
) -> PyResult<()> {
    let q = qtype_of(qtype)?;
    let path = path_of(path)?;
    let act = act_of(activations)?;
    let (n, k) = (x.shape()[0], x.shape()[1]);
    if out.shape() != [n, m] {
        return Err(PyValueError::new_err(format!(
            "qlinear: x is {:?} and out {:?}; expected x (n, k) and out (n, m = {m})",
            x.shape(),
            out.shape()
        )));
    }
    let (xs, ps) = (c_slice(&x, "qlinear: x")?, c_slice(&packed, "qlinear: packed")?);
    if !out.is_c_contiguous() {
        return Err(PyValueError::new_err("qlinear: out must be C-contiguous"));
    }
    let os = out
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("qlinear: out must be C-contiguous"))?;
    py.detach(|| crate::quant::qlinear(xs, ps, q, os, n, k, m, threads, path, act))?;
    Ok(())
}

/// Rows `rows` (int64) of a packed weight (m rows of k values of ggml type
/// `qtype`), dequantized into float32 `out` (len(rows), k) exactly as
/// gguf-py's `dequantize` gives them, on `threads` threads, GIL released.
#[pyfunction]
#[pyo3(signature = (packed, qtype, k, m, rows, out, threads=1))]
#[allow(clippy::too_many_arguments)]
fn dequantize_rows(
    py: Python<'_>,
    packed: PyReadonlyArray1<'_, u8>,
    qtype: u32,
    k: usize,
    m: usize,
    rows: PyReadonlyArray1<'_, i64>,
    mut out: PyReadwriteArray2<'_, f32>,
    threads: usize,
) -> PyResult<()> {
    let q = qtype_of(qtype)?;
    if out.shape() != [rows.len(), k] {
        return Err(PyValueError::new_err(format!(
            "dequantize_rows: out is {:?}; expected ({}, {k})",
            out.shape(),
            rows.len()
        )));
    }
    let (ps, rs) = (
        c_slice(&packed, "dequantize_rows: packed")?,
        c_slice(&rows, "dequantize_rows: rows")?,
    );
    if !out.is_c_contiguous() {
        return Err(PyValueError::new_err("dequantize_rows: out must be C-contiguous"));
    }
    let os = out
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("dequantize_rows: out must be C-contiguous"))?;
    py.detach(|| crate::quant::dequantize_rows(ps, q, k, m, rs, os, threads))?;
    Ok(())
}

/// The whole packed weight (m rows of k values), dequantized and
/// transposed into float32 `out` (k, m), exactly as gguf-py's values.
#[pyfunction]
#[pyo3(signature = (packed, qtype, k, m, out, threads=1))]
fn dequantize_transposed(
    py: Python<'_>,
    packed: PyReadonlyArray1<'_, u8>,
    qtype: u32,
    k: usize,
    m: usize,
    mut out: PyReadwriteArray2<'_, f32>,
    threads: usize,
) -> PyResult<()> {
    let q = qtype_of(qtype)?;
    if out.shape() != [k, m] {
        return Err(PyValueError::new_err(format!(
            "dequantize_transposed: out is {:?}; expected ({k}, {m})",
            out.shape()
        )));
    }
    let ps = c_slice(&packed, "dequantize_transposed: packed")?;
    let os = out
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("dequantize_transposed: out must be C-contiguous"))?;
    py.detach(|| crate::quant::dequantize_transposed(ps, q, k, m, os, threads))?;
    Ok(())
}

/// float32 rows `x` (n, k), k a multiple of 32, quantized per 32-block as
/// ggml does (`q8.rs`): (codes int8 (n, k), d (n, k/32), s (n, k/32; zeros
/// unless `with_s`), sums int32 (n, k/32)). For the tests' twin of `activations="q8"`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn quantize_q8<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    with_s: bool,
) -> PyResult<(
    Bound<'py, PyArray2<i8>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray2<i32>>,
)> {
    let (n, k) = (x.shape()[0], x.shape()[1]);
    if k == 0 || !k.is_multiple_of(32) {
        return Err(PyValueError::new_err(format!(
            "quantize_q8: rows of {k} values; expected a positive multiple of 32"
        )));
    }
    let xs = c_slice(&x, "quantize_q8: x")?;
    let r = py.detach(|| crate::q8::Q8Rows::of(xs, n, k, with_s, true));
    let nb = k / 32;
    let s = if with_s { r.s } else { vec![0.0; n * nb] };
    let shape =
        |what: &str, e: numpy::ndarray::ShapeError| PyRuntimeError::new_err(format!("quantize_q8: {what}: {e}"));
    Ok((
        Array2::from_shape_vec((n, k), r.q)
            .map_err(|e| shape("q", e))?
            .into_pyarray(py),
        Array2::from_shape_vec((n, nb), r.d)
            .map_err(|e| shape("d", e))?
            .into_pyarray(py),
        Array2::from_shape_vec((n, nb), s)
            .map_err(|e| shape("s", e))?
            .into_pyarray(py),
        Array2::from_shape_vec((n, nb), r.sum)
            .map_err(|e| shape("sum", e))?
            .into_pyarray(py),
    ))
}

/// Start (True) or stop adding the Llama layer's phase times (`probe.rs`), from zero.
#[pyfunction]
fn layer_profile(on: bool) {
    crate::probe::profile(on);
}

/// Seconds in each phase of the Llama layer since `layer_profile(True)`.
#[pyfunction]
fn layer_profile_totals() -> Vec<(&'static str, f64)> {
    crate::probe::totals()
}

/// Bytes per second `threads` threads read summing `bytes` of memory.
#[pyfunction]
#[pyo3(signature = (bytes, threads, repeats=5))]
fn read_bandwidth(py: Python<'_>, bytes: usize, threads: usize, repeats: usize) -> PyResult<f64> {
    if bytes == 0 || threads == 0 || threads > 64 {
        return Err(PyValueError::new_err("read_bandwidth: bytes >= 1 and threads in 1..64"));
    }
    Ok(py.detach(|| crate::probe::read_bandwidth(bytes, threads, repeats)))
}

/// Float32 fused multiply-adds per second on `threads` threads, widest vectors.
#[pyfunction]
fn fma_peak(py: Python<'_>, threads: usize) -> PyResult<f64> {
    if threads == 0 || threads > 64 {
        return Err(PyValueError::new_err("fma_peak: threads in 1..64"));
    }
    Ok(py.detach(|| crate::probe::fma_peak(threads)))
}

/// Rows a packed weight is padded to a multiple of (stacked weights keep
/// their parts' packed bytes apart only at this boundary).
#[pyfunction]
fn pack_rows() -> usize {
    crate::quant::PANEL * crate::quant::STRIPE
}

/// Rows `rows` (int64) of a packed weight, in the file's row-major layout:
/// (len(rows), row bytes) uint8.
#[pyfunction]
fn unpack_rows<'py>(
    py: Python<'py>,
    packed: PyReadonlyArray1<'py, u8>,
    qtype: u32,
    k: usize,
    m: usize,
    rows: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let q = qtype_of(qtype)?;
    let rb = q.row_bytes(k)?;
    let (ps, rs) = (
        c_slice(&packed, "unpack_rows: packed")?,
        c_slice(&rows, "unpack_rows: rows")?,
    );
    let raw = py.detach(|| crate::quant::unpack_rows(ps, q, k, m, rs))?;
    let array = Array2::from_shape_vec((rs.len(), rb), raw)
        .map_err(|e| PyRuntimeError::new_err(format!("unpack_rows: {e}")))?;
    Ok(array.into_pyarray(py))
}

/// An array a `LlamaStack` reads on every call: kept alive by its reference,
/// and read without a borrow check (nothing writes a model's weights).
struct Held<T: numpy::Element> {
    _array: Py<PyArray1<T>>,
    ptr: usize,
    len: usize,
}

impl<T: numpy::Element> Held<T> {
    fn of(array: Bound<'_, PyArray1<T>>, what: &str) -> PyResult<Self> {
        let view = array.readonly();
        let slice = c_slice(&view, what)?;
        let (ptr, len) = (slice.as_ptr() as usize, slice.len());
        drop(view);
        Ok(Held {
            _array: array.unbind(),
            ptr,
            len,
        })
    }

    fn slice(&self) -> &[T] {
        // SAFETY: the array is alive (held) and contiguous (checked when
        // held); a model's weights are never written after loading.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len) }
    }
}

struct HeldLayer {
    weights: Vec<(Held<u8>, crate::quant::QType)>,
    attn_norm: Held<f32>,
    ffn_norm: Held<f32>,
    qkv_bias: Option<Held<f32>>,
    qk_norms: Option<(Held<f32>, Held<f32>)>,
    shape: crate::llama::Shape,
}

/// A GGUF model's whole decoder for one call per forward (`llama::forward`):
/// each layer's packed weights (qkv, o, gate_up, down; or q, k, v, o, gate,
/// up, down), norms and shape, the final norm, and the LM head.
#[pyclass(frozen, module = "specdec_rs._core")]
struct LlamaStack {
    layers: Vec<HeldLayer>,
    norm: Held<f32>,
    eps: f32,
    head: (Held<u8>, crate::quant::QType),
    vocab: usize,
    hidden: usize,
}

/// Two float32 matrices handed back to Python.
type Arrays2<'py> = (Bound<'py, PyArray2<f32>>, Bound<'py, PyArray2<f32>>);

/// (heads, kv heads, head size, intermediate size, eps, sliding window or 0).
type Dims = (usize, usize, usize, usize, f32, usize);

/// A layer's optional q, k, v biases and (q norm, k norm) weights.
type ExtrasSpec<'py> = (
    Option<Bound<'py, PyArray1<f32>>>,
    Option<(Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>)>,
);

type LayerSpec<'py> = (
    Vec<(Bound<'py, PyArray1<u8>>, u32)>,
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray1<f32>>,
    Dims,
    ExtrasSpec<'py>,
);

fn shape_of(hidden: usize, (heads, kv_heads, head_dim, inter, eps, window): Dims) -> crate::llama::Shape {
    crate::llama::Shape {
        hidden,
        heads,
        kv_heads,
        head_dim,
        inter,
        eps,
        window,
    }
}

#[pymethods]
impl LlamaStack {
    #[new]
    fn new(
        layers: Vec<LayerSpec<'_>>,
        norm: Bound<'_, PyArray1<f32>>,
        eps: f32,
        head: (Bound<'_, PyArray1<u8>>, u32),
        vocab: usize,
    ) -> PyResult<Self> {
        let mut held = Vec::with_capacity(layers.len());
        for (i, (weights, attn_norm, ffn_norm, dims, (bias, norms))) in layers.into_iter().enumerate() {
            if weights.len() != 4 && weights.len() != 7 {
                return Err(PyValueError::new_err(format!(
                    "LlamaStack: layer {i} has {} weights; expected (qkv, o, gate_up, down) or (q, k, v, o, gate, up, down)",
                    weights.len()
                )));
            }
            let mut ws = Vec::with_capacity(weights.len());
            for (j, (w, id)) in weights.into_iter().enumerate() {
                ws.push((
                    Held::of(w, &format!("LlamaStack: layer {i} weight {j}"))?,
                    qtype_of(id)?,
                ));
            }
            let attn_norm = Held::of(attn_norm, "LlamaStack: attn_norm")?;
            let ffn_norm = Held::of(ffn_norm, "LlamaStack: ffn_norm")?;
            let qkv_bias = match bias {
                Some(b) => Some(Held::of(b, &format!("LlamaStack: layer {i} qkv_bias"))?),
                None => None,
            };
            let qk_norms = match norms {
                Some((q, k)) => Some((
                    Held::of(q, &format!("LlamaStack: layer {i} q_norm"))?,
                    Held::of(k, &format!("LlamaStack: layer {i} k_norm"))?,
                )),
                None => None,
            };
            let shape = shape_of(attn_norm.len, dims);
            held.push(HeldLayer {
                weights: ws,
                attn_norm,
                ffn_norm,
                qkv_bias,
                qk_norms,
                shape,
            });
        }
        let norm = Held::of(norm, "LlamaStack: norm")?;
        let hidden = norm.len;
        if held.is_empty() || held.iter().any(|l| l.shape.hidden != hidden) {
            return Err(PyValueError::new_err(
                "LlamaStack: at least one layer, every norm of the hidden size",
            ));
        }
        let q = qtype_of(head.1)?;
        Ok(LlamaStack {
            layers: held,
            norm,
            eps,
            head: (Held::of(head.0, "LlamaStack: head")?, q),
            vocab,
            hidden,
        })
    }

    /// The stack over x (N, hidden) in place (see `llama::forward`):
    /// keys[s · L + l], values[s · L + l] sequence s's cache of layer l
    /// (kv_heads, capacity, head_dim), pasts[s] its filled positions,
    /// lengths[s] its rows of x; mask None (causal) or, for one sequence,
    /// (n, past + n) uint8; the logits of rows `rows`. Returns (logits
    /// (len(rows), vocab), the final-normed states (N, hidden)).
    #[pyo3(signature = (x, cos, sin, keys, values, pasts, lengths, mask, rows, threads, path=None, activations="f32"))]
    #[allow(clippy::too_many_arguments)]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        mut x: PyReadwriteArray2<'py, f32>,
        cos: PyReadonlyArray2<'py, f32>,
        sin: PyReadonlyArray2<'py, f32>,
        mut keys: Vec<numpy::PyReadwriteArray3<'py, f32>>,
        mut values: Vec<numpy::PyReadwriteArray3<'py, f32>>,
        pasts: Vec<usize>,
        lengths: Vec<usize>,
        mask: Option<PyReadonlyArray2<'py, u8>>,
        rows: Vec<usize>,
        threads: usize,
        path: Option<&str>,
        activations: &str,
    ) -> PyResult<Arrays2<'py>> {
        let (path, act) = (path_of(path)?, act_of(activations)?);
        let (sequences, depth) = (lengths.len(), self.layers.len());
        if sequences == 0 || pasts.len() != sequences || keys.len() != sequences * depth || values.len() != keys.len() {
            return Err(PyValueError::new_err(format!(
                "LlamaStack.forward: {} keys, {} values, {} pasts for {sequences} sequences of {depth} layers; \
                 pass one key and value array per sequence and layer (sequence-major)",
                keys.len(),
                values.len(),
                pasts.len()
            )));
        }
        if mask.is_some() && sequences != 1 {
            return Err(PyValueError::new_err(
                "LlamaStack.forward: a mask is for one sequence (a tree)",
            ));
        }
        let n: usize = lengths.iter().sum();
        if x.shape() != [n, self.hidden] {
            return Err(PyValueError::new_err(format!(
                "LlamaStack.forward: x is {:?}; expected ({n}, {}) for the lengths given",
                x.shape(),
                self.hidden
            )));
        }
        for (i, (k, v)) in keys.iter().zip(&values).enumerate() {
            let l = &self.layers[i % depth].shape;
            let capacity = k.shape()[1];
            if k.shape() != [l.kv_heads, capacity, l.head_dim] || v.shape() != k.shape() {
                return Err(PyValueError::new_err(format!(
                    "LlamaStack.forward: sequence {} layer {}: keys {:?}, values {:?}; expected ({}, capacity, {})",
                    i / depth,
                    i % depth,
                    k.shape(),
                    v.shape(),
                    l.kv_heads,
                    l.head_dim
                )));
            }
        }
        let stack = crate::llama::Stack {
            layers: self.layers.iter().map(|l| (layer_weights(l), l.shape)).collect(),
            norm: self.norm.slice(),
            eps: self.eps,
            head: crate::llama::Weight {
                packed: self.head.0.slice(),
                q: self.head.1,
            },
            vocab: self.vocab,
        };
        let (cs, ss) = (
            c_slice(&cos, "LlamaStack.forward: cos")?,
            c_slice(&sin, "LlamaStack.forward: sin")?,
        );
        let ms = match &mask {
            Some(m) => Some(c_slice(m, "LlamaStack.forward: mask")?),
            None => None,
        };
        let contiguous =
            |what: String| PyValueError::new_err(format!("LlamaStack.forward: {what} must be C-contiguous"));
        let mut caches: Vec<Vec<crate::llama::Segment>> = (0..depth).map(|_| Vec::with_capacity(sequences)).collect();
        for (i, (k, v)) in keys.iter_mut().zip(values.iter_mut()).enumerate() {
            let (seq, layer) = (i / depth, i % depth);
            let capacity = k.shape()[1];
            caches[layer].push(crate::llama::Segment {
                n: lengths[seq],
                cache: crate::llama::Cache {
                    keys: k.as_slice_mut().map_err(|_| contiguous(format!("keys[{i}]")))?,
                    values: v.as_slice_mut().map_err(|_| contiguous(format!("values[{i}]")))?,
                    capacity,
                    past: pasts[seq],
                },
                mask: ms,
            });
        }
        let xs = x.as_slice_mut().map_err(|_| contiguous("x".into()))?;
        let mut logits = vec![0.0f32; rows.len() * self.vocab];
        let mut states = vec![0.0f32; n * self.hidden];
        py.detach(|| {
            crate::llama::forward(
                xs,
                cs,
                ss,
                &mut caches,
                &stack,
                &rows,
                &mut logits,
                &mut states,
                threads,
                path,
                act,
            )
        })?;
        let shape = |e: numpy::ndarray::ShapeError| PyRuntimeError::new_err(format!("LlamaStack.forward: {e}"));
        Ok((
            Array2::from_shape_vec((rows.len(), self.vocab), logits)
                .map_err(shape)?
                .into_pyarray(py),
            Array2::from_shape_vec((n, self.hidden), states)
                .map_err(shape)?
                .into_pyarray(py),
        ))
    }
}

fn layer_weights(l: &HeldLayer) -> crate::llama::Weights<'_> {
    use crate::llama::{Proj, Weight};
    let w: Vec<Weight> = l
        .weights
        .iter()
        .map(|(h, q)| Weight {
            packed: h.slice(),
            q: *q,
        })
        .collect();
    let (qd, kvd) = (l.shape.heads * l.shape.head_dim, l.shape.kv_heads * l.shape.head_dim);
    let (qkv, o, gate_up, down) = if w.len() == 4 {
        (Proj::One(w[0]), w[1], Proj::One(w[2]), w[3])
    } else {
        (
            Proj::Parts(vec![(w[0], qd), (w[1], kvd), (w[2], kvd)]),
            w[3],
            Proj::Parts(vec![(w[4], l.shape.inter), (w[5], l.shape.inter)]),
            w[6],
        )
    };
    crate::llama::Weights {
        qkv,
        o,
        gate_up,
        down,
        attn_norm: l.attn_norm.slice(),
        ffn_norm: l.ffn_norm.slice(),
        extras: crate::llama::Extras {
            qkv_bias: l.qkv_bias.as_ref().map(|b| b.slice()),
            qk_norms: l.qk_norms.as_ref().map(|(q, k)| (q.slice(), k.slice())),
        },
    }
}

/// One Llama decoder layer in place on `x` (N, hidden): see `llama.rs`.
/// The N rows are the `lengths` (n_s) rows of each sequence s, one after
/// another. `cos`, `sin` (N, head_dim); `keys[s]`, `values[s]` (kv_heads,
/// capacity_s, head_dim) with `pasts[s]` positions filled (this step writes
/// the next n_s); `mask` None (causal) or, for one sequence, (n, past + n)
/// uint8; `weights` the packed (qkv, o, gate_up, down) with their ggml
/// types; `shape` (heads, kv_heads, head_dim, intermediate, eps, sliding
/// window or 0); `qkv_bias` (heads·d + 2·kv_heads·d) and `qk_norms` (q
/// norm, k norm), (d,) each, where the architecture has them.
#[pyfunction]
#[pyo3(signature = (x, cos, sin, keys, values, pasts, lengths, mask, weights, attn_norm, ffn_norm, shape, threads, path=None, activations="f32", qkv_bias=None, qk_norms=None))]
#[allow(clippy::too_many_arguments)]
fn llama_layer(
    py: Python<'_>,
    mut x: PyReadwriteArray2<'_, f32>,
    cos: PyReadonlyArray2<'_, f32>,
    sin: PyReadonlyArray2<'_, f32>,
    mut keys: Vec<numpy::PyReadwriteArray3<'_, f32>>,
    mut values: Vec<numpy::PyReadwriteArray3<'_, f32>>,
    pasts: Vec<usize>,
    lengths: Vec<usize>,
    mask: Option<PyReadonlyArray2<'_, u8>>,
    weights: Vec<(PyReadonlyArray1<'_, u8>, u32)>,
    attn_norm: PyReadonlyArray1<'_, f32>,
    ffn_norm: PyReadonlyArray1<'_, f32>,
    shape: Dims,
    threads: usize,
    path: Option<&str>,
    activations: &str,
    qkv_bias: Option<PyReadonlyArray1<'_, f32>>,
    qk_norms: Option<(PyReadonlyArray1<'_, f32>, PyReadonlyArray1<'_, f32>)>,
) -> PyResult<()> {
    let path = path_of(path)?;
    let act = act_of(activations)?;
    if weights.len() != 4 && weights.len() != 7 {
        return Err(PyValueError::new_err(
            "llama_layer: weights are (qkv, o, gate_up, down) or (q, k, v, o, gate, up, down)",
        ));
    }
    let sequences = lengths.len();
    if sequences == 0 || keys.len() != sequences || values.len() != sequences || pasts.len() != sequences {
        return Err(PyValueError::new_err(format!(
            "llama_layer: {} keys, {} values, {} pasts for {sequences} sequences; pass one of each per sequence (at least one)",
            keys.len(),
            values.len(),
            pasts.len()
        )));
    }
    if mask.is_some() && sequences != 1 {
        return Err(PyValueError::new_err(
            "llama_layer: a mask is for one sequence (a tree); a batch of sequences is causal",
        ));
    }
    let hidden = x.shape()[1];
    let (heads, kv_heads, head_dim, inter, _, _) = shape;
    for (i, (k, v)) in keys.iter().zip(&values).enumerate() {
        let capacity = k.shape()[1];
        if k.shape() != [kv_heads, capacity, head_dim] || v.shape() != k.shape() {
            return Err(PyValueError::new_err(format!(
                "llama_layer: sequence {i}: keys {:?} and values {:?}; expected ({kv_heads}, capacity, {head_dim})",
                k.shape(),
                v.shape()
            )));
        }
    }
    let mut ws = Vec::with_capacity(4);
    for (i, (packed, id)) in weights.iter().enumerate() {
        ws.push(crate::llama::Weight {
            packed: c_slice(packed, &format!("llama_layer: weights[{i}]"))?,
            q: qtype_of(*id)?,
        });
    }
    use crate::llama::Proj;
    let (qd, kvd) = (heads * head_dim, kv_heads * head_dim);
    let (qkv, o, gate_up, down) = if ws.len() == 4 {
        (Proj::One(ws[0]), ws[1], Proj::One(ws[2]), ws[3])
    } else {
        (
            Proj::Parts(vec![(ws[0], qd), (ws[1], kvd), (ws[2], kvd)]),
            ws[3],
            Proj::Parts(vec![(ws[4], inter), (ws[5], inter)]),
            ws[6],
        )
    };
    let w = crate::llama::Weights {
        qkv,
        o,
        gate_up,
        down,
        attn_norm: c_slice(&attn_norm, "llama_layer: attn_norm")?,
        ffn_norm: c_slice(&ffn_norm, "llama_layer: ffn_norm")?,
        extras: crate::llama::Extras {
            qkv_bias: match &qkv_bias {
                Some(b) => Some(c_slice(b, "llama_layer: qkv_bias")?),
                None => None,
            },
            qk_norms: match &qk_norms {
                Some((q, k)) => Some((c_slice(q, "llama_layer: q_norm")?, c_slice(k, "llama_layer: k_norm")?)),
                None => None,
            },
        },
    };
    let s = shape_of(hidden, shape);
    let (cs, ss) = (c_slice(&cos, "llama_layer: cos")?, c_slice(&sin, "llama_layer: sin")?);
    let ms = match &mask {
        Some(m) => Some(c_slice(m, "llama_layer: mask")?),
        None => None,
    };
    let contiguous = |what: String| PyValueError::new_err(format!("llama_layer: {what} must be C-contiguous"));
    let xs = x.as_slice_mut().map_err(|_| contiguous("x".into()))?;
    let mut segments = Vec::with_capacity(sequences);
    for (i, (k, v)) in keys.iter_mut().zip(values.iter_mut()).enumerate() {
        let capacity = k.shape()[1];
        segments.push(crate::llama::Segment {
            n: lengths[i],
            cache: crate::llama::Cache {
                keys: k.as_slice_mut().map_err(|_| contiguous(format!("keys[{i}]")))?,
                values: v.as_slice_mut().map_err(|_| contiguous(format!("values[{i}]")))?,
                capacity,
                past: pasts[i],
            },
            mask: ms,
        });
    }
    py.detach(|| crate::llama::layer(xs, cs, ss, &mut segments, w, s, threads, path, act))?;
    Ok(())
}

/// The widest instruction path `qlinear` runs on this CPU: "avx512-vnni",
/// "avx512", "avx2-vnni", "avx2" or "portable".
#[pyfunction]
fn qlinear_path() -> &'static str {
    crate::quant::best_path().name()
}

/// Whether `linear_f32` runs on this CPU's AVX2 + FMA path (else a slow portable one).
#[pyfunction]
fn linear_vectorized() -> bool {
    crate::linear::vector_fma()
}

/// The seed that row `index` of a batch call with `seed` uses.
#[pyfunction]
fn row_seed(seed: u64, index: u64) -> u64 {
    crate::rng::row_seed(seed, index)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(verify_batch, m)?)?;
    m.add_class::<Simulation>()?;
    m.add_class::<SuffixTrie>()?;
    m.add_class::<LlamaStack>()?;
    m.add_function(wrap_pyfunction!(verify_tree, m)?)?;
    m.add_function(wrap_pyfunction!(row_seed, m)?)?;
    m.add_function(wrap_pyfunction!(accept_gathered, m)?)?;
    m.add_function(wrap_pyfunction!(finish_round, m)?)?;
    m.add_function(wrap_pyfunction!(linear_f32, m)?)?;
    m.add_function(wrap_pyfunction!(linear_vectorized, m)?)?;
    m.add_function(wrap_pyfunction!(qlinear, m)?)?;
    m.add_function(wrap_pyfunction!(llama_layer, m)?)?;
    m.add_function(wrap_pyfunction!(pack_weight, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize_rows, m)?)?;
    m.add_function(wrap_pyfunction!(unpack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize_transposed, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_q8, m)?)?;
    m.add_function(wrap_pyfunction!(pack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(layer_profile, m)?)?;
    m.add_function(wrap_pyfunction!(layer_profile_totals, m)?)?;
    m.add_function(wrap_pyfunction!(read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(fma_peak, m)?)?;
    m.add_function(wrap_pyfunction!(qlinear_path, m)?)?;
    m.add("VARIANTS", Variant::names().collect::<Vec<_>>())?;
    m.add("TREE_VARIANTS", TreeRule::names().collect::<Vec<_>>())?;
    m.add("CHILDREN", Children::names().collect::<Vec<_>>())?;
    m.add("METHODS", Method::names().collect::<Vec<_>>())?;
    m.add("MAX_THREADS", MAX_THREADS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
