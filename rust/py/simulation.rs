//! The Monte Carlo engine's binding: `Simulation` over a chain or tree toy model.

use super::*;

pub(super) fn chain(
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
pub(super) struct Simulation {
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
