//! The Python boundary (module `specdec_rs._core`): NumPy arrays in, zero-copy,
//! GIL released around the work, `SpecError` out as `ValueError`, Ctrl-C
//! honoured during long simulations.
//!
//! The only module that touches PyO3 (house style), split by subject: one
//! thin wrapper per function in `verifiers`, `simulation`, `suffix`,
//! `kernels` and `layers`; the shared pieces (errors, thread pools, the
//! interruptible call, dtype dispatch) and the module itself here.

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

fn qtype_of(id: u32) -> PyResult<crate::quant::QType> {
    crate::quant::QType::from_ggml(id).ok_or_else(|| {
        PyValueError::new_err(format!(
            "ggml type {id} has no native kernel; expected F32 (0), F16 (1), Q4_0 (2), Q4_1 (3), \
             Q5_0 (6), Q5_1 (7), Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14), IQ4_NL (20) or BF16 (30)"
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

mod kernels;
mod layers;
mod simulation;
mod suffix;
mod verifiers;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verifiers::verify, m)?)?;
    m.add_function(wrap_pyfunction!(verifiers::verify_batch, m)?)?;
    m.add_class::<simulation::Simulation>()?;
    m.add_class::<suffix::SuffixTrie>()?;
    m.add_class::<layers::LlamaStack>()?;
    m.add_function(wrap_pyfunction!(verifiers::verify_tree, m)?)?;
    m.add_function(wrap_pyfunction!(verifiers::row_seed, m)?)?;
    m.add_function(wrap_pyfunction!(verifiers::accept_gathered, m)?)?;
    m.add_function(wrap_pyfunction!(verifiers::finish_round, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::linear_f32, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::linear_vectorized, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::qlinear, m)?)?;
    m.add_function(wrap_pyfunction!(layers::llama_layer, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::pack_weight, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::dequantize_rows, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::unpack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::dequantize_transposed, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::quantize_q8, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::masked_logits, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::pack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::panel_rows, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::layer_profile, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::layer_profile_totals, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::fma_peak, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::qlinear_path, m)?)?;
    m.add("VARIANTS", Variant::names().collect::<Vec<_>>())?;
    m.add("TREE_VARIANTS", TreeRule::names().collect::<Vec<_>>())?;
    m.add("CHILDREN", Children::names().collect::<Vec<_>>())?;
    m.add("METHODS", Method::names().collect::<Vec<_>>())?;
    m.add("MAX_THREADS", MAX_THREADS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
