//! The verifiers' bindings: `verify`, `verify_batch`, `verify_tree`, the
//! gathered acceptance and `finish_round` (the token path's round), `row_seed`.

use super::*;

/// The row checks of a call: `full`, and each array's tolerance (the
/// element type's default when not given).
pub(super) fn checks<P: Prob, Q: Prob>(full: bool, p_tol: Option<f64>, q_tol: Option<f64>) -> Checks {
    let default = Checks::of::<P, Q>(full);
    Checks {
        full,
        p_tol: p_tol.unwrap_or(default.p_tol),
        q_tol: q_tol.unwrap_or(default.q_tol),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn verify_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
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
pub(super) fn verify(
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
pub(super) fn batch_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
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
pub(super) fn verify_batch(
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
pub(super) fn tree_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
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
pub(super) fn verify_tree(
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

/// Phase 1 of a round from gathered values; see `specdec_rs.verify_gathered`.
#[pyfunction]
pub(super) fn accept_gathered(
    px: PyReadonlyArray1<'_, f64>,
    qx: PyReadonlyArray1<'_, f64>,
    seed: u64,
) -> PyResult<usize> {
    Ok(crate::verify::accept_gathered(px.as_array(), qx.as_array(), seed)?)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn finish_typed<P: Prob + numpy::Element, Q: Prob + numpy::Element>(
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
pub(super) fn finish_round(
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

/// The seed that row `index` of a batch call with `seed` uses.
#[pyfunction]
pub(super) fn row_seed(seed: u64, index: u64) -> u64 {
    crate::rng::row_seed(seed, index)
}
