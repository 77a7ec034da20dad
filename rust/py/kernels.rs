//! The products' bindings: `linear_f32`, the quantized `qlinear`, packing,
//! dequantization, q8 activations, the layer profile and the host probes.

use super::*;

/// `out = x · wᵀ` in f32 for C-contiguous `x` (n, k), `w` (m, k) and a
/// writable `out` (n, m), on the calling thread with the GIL released. See
/// `linear.rs`: built for a few rows against a large weight.
#[pyfunction]
pub(super) fn linear_f32(
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

/// A row-major weight `w` (m, row bytes) of ggml type `qtype` and row
/// length k in the kernel's packed layout (`quant.rs`: panels of 16 rows in stripes of 4),
/// as a 1-D uint8 array.
#[pyfunction]
pub(super) fn pack_weight<'py>(
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
pub(super) fn qlinear(
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
pub(super) fn dequantize_rows(
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
pub(super) fn dequantize_transposed(
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

/// The constrained target's logits: `logits` float32 (n, width) → (n,
/// vocab), the first `vocab` ids of every row with those refused by
/// `allowed` (m ≤ n rows of `vocab` bools, for the first m rows) at −inf,
/// the later rows as they are (`rowwise::mask_logits`), GIL released.
#[pyfunction]
pub(super) fn masked_logits<'py>(
    py: Python<'py>,
    logits: PyReadonlyArray2<'py, f32>,
    allowed: PyReadonlyArray2<'py, bool>,
    vocab: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (n, width) = (logits.shape()[0], logits.shape()[1]);
    let (m, flags) = (allowed.shape()[0], allowed.shape()[1]);
    if vocab == 0 || vocab > width || flags != vocab || m > n {
        return Err(PyValueError::new_err(format!(
            "masked_logits: logits ({n}, {width}), allowed ({m}, {flags}), vocab {vocab}; \
             expected 0 < vocab <= logits' width, allowed of (m <= {n}, vocab) flags"
        )));
    }
    let (ls, fs) = (
        c_slice(&logits, "masked_logits: logits")?,
        c_slice(&allowed, "masked_logits: allowed")?,
    );
    let path = crate::quant::best_path();
    let out = py.detach(|| {
        let mut out = vec![0.0f32; n * vocab];
        crate::rowwise::mask_logits(path, ls, width, fs, &mut out, vocab);
        out
    });
    Array2::from_shape_vec((n, vocab), out)
        .map(|a| a.into_pyarray(py))
        .map_err(|e| PyRuntimeError::new_err(format!("masked_logits: {e}")))
}

/// float32 rows `x` (n, k), k a multiple of 32, quantized per 32-block as
/// ggml does (`q8.rs`): (codes int8 (n, k), d (n, k/32), s (n, k/32; zeros
/// unless `with_s`), sums int32 (n, k/32)). For the tests' twin of `activations="q8"`.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(super) fn quantize_q8<'py>(
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
pub(super) fn layer_profile(on: bool) {
    crate::probe::profile(on);
}

/// Seconds in each phase of the Llama layer since `layer_profile(True)`.
#[pyfunction]
pub(super) fn layer_profile_totals() -> Vec<(&'static str, f64)> {
    crate::probe::totals()
}

/// Bytes per second `threads` threads read summing `bytes` of memory.
#[pyfunction]
#[pyo3(signature = (bytes, threads, repeats=5))]
pub(super) fn read_bandwidth(py: Python<'_>, bytes: usize, threads: usize, repeats: usize) -> PyResult<f64> {
    if bytes == 0 || threads == 0 || threads > 64 {
        return Err(PyValueError::new_err("read_bandwidth: bytes >= 1 and threads in 1..64"));
    }
    Ok(py.detach(|| crate::probe::read_bandwidth(bytes, threads, repeats)))
}

/// Float32 fused multiply-adds per second on `threads` threads, widest vectors.
#[pyfunction]
pub(super) fn fma_peak(py: Python<'_>, threads: usize) -> PyResult<f64> {
    if threads == 0 || threads > 64 {
        return Err(PyValueError::new_err("fma_peak: threads in 1..64"));
    }
    Ok(py.detach(|| crate::probe::fma_peak(threads)))
}

/// Rows a packed weight is padded to a multiple of (stacked weights keep
/// their parts' packed bytes apart only at this boundary).
#[pyfunction]
pub(super) fn pack_rows() -> usize {
    crate::quant::PANEL * crate::quant::STRIPE
}

/// Output rows of one panel: `LlamaStack.forward`'s `panels` and
/// `qlinear_panels` name panels of this many outputs.
#[pyfunction]
pub(super) fn panel_rows() -> usize {
    crate::quant::PANEL
}

/// Rows `rows` (int64) of a packed weight, in the file's row-major layout:
/// (len(rows), row bytes) uint8.
#[pyfunction]
pub(super) fn unpack_rows<'py>(
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

/// The widest instruction path `qlinear` runs on this CPU: "avx512-vnni",
/// "avx512", "avx2-vnni", "avx2" or "portable".
#[pyfunction]
pub(super) fn qlinear_path() -> &'static str {
    crate::quant::best_path().name()
}

/// Whether `linear_f32` runs on this CPU's AVX2 + FMA path (else a slow portable one).
#[pyfunction]
pub(super) fn linear_vectorized() -> bool {
    crate::linear::vector_fma()
}
