//! The suffix drafter's index: `SuffixTrie`.

use super::*;

/// Token ids from Python ints: each in [0, 2^32), else a ValueError naming `what`.
pub(super) fn token_ids(values: Vec<i64>, what: &str) -> PyResult<Vec<u32>> {
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
pub(super) struct SuffixTrie {
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
