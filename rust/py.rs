//! The Python boundary (module `specdec_rs._core`): NumPy arrays in, zero-copy,
//! GIL released around the work, `SpecError` out as `ValueError`.

use ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::SpecError;
use crate::prob::Prob;
use crate::sim::{Chain, Variant};

impl From<SpecError> for PyErr {
    fn from(e: SpecError) -> PyErr {
        PyValueError::new_err(e.to_string())
    }
}

/// Run `f` on a pool of `threads` threads, or on rayon's global pool.
fn in_pool<T: Send>(threads: Option<usize>, f: impl FnOnce() -> crate::Result<T> + Send) -> crate::Result<T> {
    match threads {
        None => f(),
        Some(0) => Err(SpecError::Invalid("threads = 0; expected threads >= 1 or None".into())),
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| SpecError::Invalid(format!("cannot start {n} threads: {e}")))?
            .install(f),
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

fn verify_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    drafts: &PyReadonlyArray1<'_, i64>,
    seed: u64,
    validate: bool,
) -> PyResult<Option<Py<PyArray1<i64>>>> {
    let (Ok(p), Ok(q)) = (p.extract::<PyReadonlyArray2<P>>(), q.extract::<PyReadonlyArray2<Q>>()) else {
        return Ok(None);
    };
    let (pv, qv, dv) = (p.as_array(), q.as_array(), drafts.as_array());
    let out = py.detach(|| crate::verify::verify(pv, qv, dv, seed, validate))?;
    Ok(Some(out.into_pyarray(py).unbind()))
}

/// One speculative round; see `specdec_rs.verify`.
#[pyfunction]
#[pyo3(signature = (p_rows, q_rows, drafts, seed, validate=true))]
fn verify(
    py: Python<'_>,
    p_rows: &Bound<'_, PyAny>,
    q_rows: &Bound<'_, PyAny>,
    drafts: PyReadonlyArray1<'_, i64>,
    seed: u64,
    validate: bool,
) -> PyResult<Py<PyArray1<i64>>> {
    dispatch_dtypes!(verify_typed(py, p_rows, q_rows, &drafts, seed, validate), "p_rows and q_rows")
}

type BatchOut = (Py<PyArray2<i64>>, Py<PyArray1<i64>>);

fn batch_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    drafts: &PyReadonlyArray2<'_, i64>,
    seed: u64,
    validate: bool,
    threads: Option<usize>,
) -> PyResult<Option<BatchOut>> {
    let (Ok(p), Ok(q)) = (p.extract::<PyReadonlyArray3<P>>(), q.extract::<PyReadonlyArray3<Q>>()) else {
        return Ok(None);
    };
    let (pv, qv, dv) = (p.as_array(), q.as_array(), drafts.as_array());
    let batch = py.detach(|| in_pool(threads, || crate::verify::verify_batch(pv, qv, dv, seed, validate)))?;
    let rows = batch.num_emitted.len();
    let tokens = Array2::from_shape_vec((rows, batch.width), batch.tokens)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(Some((tokens.into_pyarray(py).unbind(), batch.num_emitted.into_pyarray(py).unbind())))
}

/// B independent rounds; see `specdec_rs.verify_batch`.
#[pyfunction]
#[pyo3(signature = (p, q, drafts, seed, validate=true, threads=None))]
fn verify_batch(
    py: Python<'_>,
    p: &Bound<'_, PyAny>,
    q: &Bound<'_, PyAny>,
    drafts: PyReadonlyArray2<'_, i64>,
    seed: u64,
    validate: bool,
    threads: Option<usize>,
) -> PyResult<BatchOut> {
    dispatch_dtypes!(batch_typed(py, p, q, &drafts, seed, validate, threads), "p and q")
}

fn chain(p_table: &PyReadonlyArray2<'_, f64>, q_table: &PyReadonlyArray2<'_, f64>) -> PyResult<Chain> {
    if !p_table.is_c_contiguous() || !q_table.is_c_contiguous() {
        return Err(dtype_error("p_table and q_table"));
    }
    Ok(Chain::new(p_table.as_array(), q_table.as_array())?)
}

/// Joint histogram (flat) of the first `num_tokens` tokens; see `specdec_rs.simulate`.
#[pyfunction]
#[pyo3(signature = (p_table, q_table, k, runs, num_tokens, start, variant, seed, threads=None))]
#[allow(clippy::too_many_arguments)]
fn simulate(
    py: Python<'_>,
    p_table: PyReadonlyArray2<'_, f64>,
    q_table: PyReadonlyArray2<'_, f64>,
    k: usize,
    runs: u64,
    num_tokens: usize,
    start: usize,
    variant: &str,
    seed: u64,
    threads: Option<usize>,
) -> PyResult<Py<PyArray1<i64>>> {
    let chain = chain(&p_table, &q_table)?;
    let variant: Variant = variant.parse()?;
    let hist = py.detach(|| in_pool(threads, || crate::sim::simulate(&chain, variant, k, runs, num_tokens, start, seed)))?;
    Ok(hist.into_pyarray(py).unbind())
}

/// Counts of rounds by tokens emitted; see `specdec_rs.simulate_round_lengths`.
#[pyfunction]
#[pyo3(signature = (p_table, q_table, k, rounds, start, variant, seed, threads=None))]
#[allow(clippy::too_many_arguments)]
fn simulate_round_lengths(
    py: Python<'_>,
    p_table: PyReadonlyArray2<'_, f64>,
    q_table: PyReadonlyArray2<'_, f64>,
    k: usize,
    rounds: u64,
    start: usize,
    variant: &str,
    seed: u64,
    threads: Option<usize>,
) -> PyResult<Py<PyArray1<i64>>> {
    let chain = chain(&p_table, &q_table)?;
    let variant: Variant = variant.parse()?;
    let counts = py.detach(|| in_pool(threads, || crate::sim::simulate_round_lengths(&chain, variant, k, rounds, start, seed)))?;
    Ok(counts.into_pyarray(py).unbind())
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
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_round_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(row_seed, m)?)?;
    m.add("VARIANTS", Variant::NAMES.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
