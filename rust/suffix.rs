//! A bounded-depth suffix trie of counts: the index behind the suffix
//! drafter (`specdec_rs.drafters.suffix`). A node is a substring of at most
//! `depth` tokens of the sequences added; its count is how often it
//! occurred, its children the tokens that followed. Each node also keeps the
//! sum of its children's counts and its most frequent child (the first to
//! reach the largest count), updated as counts change, so a draft step is
//! O(1). Nodes live in one arena (ids; 0 is the root); a node whose count
//! falls to 0 goes back to a free list with its subtree.

use rustc_hash::FxHashMap;

use crate::error::{Result, SpecError};

/// The root's id.
pub const ROOT: u32 = 0;

#[derive(Default, Clone)]
struct Node {
    count: u32,
    total: u32,
    best: Option<u32>,
    children: FxHashMap<u32, u32>,
}

/// The trie (see the module docs).
pub struct SuffixTrie {
    depth: usize,
    nodes: Vec<Node>,
    free: Vec<u32>,
}

impl SuffixTrie {
    /// An empty trie counting substrings of at most `depth` (>= 2) tokens.
    pub fn new(depth: usize) -> Result<Self> {
        if depth < 2 {
            return Err(SpecError::Invalid(format!(
                "depth = {depth}; a suffix index counts substrings of at least 2 tokens"
            )));
        }
        Ok(SuffixTrie {
            depth,
            nodes: vec![Node::default()],
            free: Vec::new(),
        })
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Nodes in use (the root included).
    pub fn len(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes[ROOT as usize].children.is_empty()
    }

    fn node(&self, id: u32) -> Result<&Node> {
        match self.nodes.get(id as usize) {
            Some(n) if id == ROOT || n.count > 0 => Ok(n),
            _ => Err(SpecError::Invalid(format!(
                "suffix index node {id} does not exist (stale id)"
            ))),
        }
    }

    fn new_node(&mut self) -> u32 {
        match self.free.pop() {
            Some(id) => id,
            None => {
                self.nodes.push(Node::default());
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// The suffix nodes (lengths 1, 2, ...) after appending `tokens` to a
    /// sequence whose suffix nodes are `suffixes`; the counts added.
    pub fn grow(&mut self, suffixes: &[u32], tokens: &[u32]) -> Result<Vec<u32>> {
        for &id in suffixes {
            self.node(id)?;
        }
        let depth = self.depth;
        let mut current: Vec<u32> = suffixes.to_vec();
        let mut grown: Vec<u32> = Vec::with_capacity(depth);
        for &t in tokens {
            grown.clear();
            grown.push(ROOT);
            grown.extend(current.iter().take(depth - 1));
            current.clear();
            for &parent in &grown {
                let child = match self.nodes[parent as usize].children.get(&t) {
                    Some(&c) => c,
                    None => {
                        let c = self.new_node();
                        self.nodes[parent as usize].children.insert(t, c);
                        c
                    }
                };
                self.nodes[child as usize].count += 1;
                let count = self.nodes[child as usize].count;
                let p = &mut self.nodes[parent as usize];
                p.total += 1;
                let replace = match p.best {
                    None => true,
                    Some(b) if b == t => false,
                    Some(b) => {
                        let b = p.children[&b];
                        count > self.nodes[b as usize].count
                    }
                };
                if replace {
                    self.nodes[parent as usize].best = Some(t);
                }
                current.push(child);
            }
        }
        Ok(current)
    }

    /// Take one earlier `grow([], tokens)` back out (nodes left at 0 go).
    pub fn remove(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let mut node = ROOT;
            for &t in &tokens[start..(start + self.depth).min(tokens.len())] {
                let Some(&child) = self.nodes[node as usize].children.get(&t) else {
                    break;
                };
                self.nodes[child as usize].count -= 1;
                self.nodes[node as usize].total -= 1;
                let gone = self.nodes[child as usize].count == 0;
                if gone {
                    self.nodes[node as usize].children.remove(&t);
                    self.release(child);
                }
                if self.nodes[node as usize].best == Some(t) {
                    self.rebest(node);
                }
                if gone {
                    break;
                }
                node = child;
            }
        }
    }

    /// The most frequent child again (after a count fell): the largest
    /// count, the smallest token among equals.
    fn rebest(&mut self, id: u32) {
        let n = &self.nodes[id as usize];
        let best = n
            .children
            .iter()
            .map(|(&t, &c)| (self.nodes[c as usize].count, std::cmp::Reverse(t)))
            .max()
            .map(|(_, std::cmp::Reverse(t))| t);
        self.nodes[id as usize].best = best;
    }

    fn release(&mut self, id: u32) {
        let mut stack = vec![id];
        while let Some(i) = stack.pop() {
            let n = std::mem::take(&mut self.nodes[i as usize]);
            stack.extend(n.children.values());
            self.free.push(i);
        }
    }

    /// The node of `pattern`, if it occurred.
    pub fn find(&self, pattern: &[u32]) -> Option<u32> {
        let mut node = ROOT;
        for t in pattern {
            node = *self.nodes[node as usize].children.get(t)?;
        }
        Some(node)
    }

    /// (node, m) of the longest suffix of `seq` (m <= max_match) that
    /// occurred with a continuation, by bisection: if the last m tokens
    /// occurred followed by x, so did the last m − 1 (at the same place).
    pub fn longest_match(&self, seq: &[u32], max_match: usize) -> (Option<u32>, usize) {
        let (mut lo, mut hi) = (0, max_match.min(seq.len()).min(self.depth - 1));
        let mut best = (None, 0);
        while lo < hi {
            let m = (lo + hi).div_ceil(2);
            match self.find(&seq[seq.len() - m..]) {
                Some(n) if !self.nodes[n as usize].children.is_empty() => {
                    lo = m;
                    best = (Some(n), m);
                }
                _ => hi = m - 1,
            }
        }
        best
    }

    /// The most frequent continuation from `node` while its path
    /// probability (the product of count / total along the way) stays at
    /// or above `min_prob`; at most `limit` tokens. (tokens, probabilities)
    pub fn chain(&self, node: u32, limit: usize, min_prob: f64) -> Result<(Vec<u32>, Vec<f64>)> {
        self.node(node)?;
        let (mut tokens, mut probs) = (Vec::new(), Vec::new());
        let (mut at, mut path) = (node, 1.0f64);
        while tokens.len() < limit {
            let n = &self.nodes[at as usize];
            let Some(t) = n.best else { break };
            let child = n.children[&t];
            path *= f64::from(self.nodes[child as usize].count) / f64::from(n.total);
            if path < min_prob {
                break;
            }
            tokens.push(t);
            probs.push(path);
            at = child;
        }
        Ok((tokens, probs))
    }

    /// (tokens, parents) of the continuations of `node` expanded by largest
    /// path probability first (each >= min_prob), at most `budget` nodes and
    /// `limit` deep; siblings by count, then token. Parents: -1 = `node`.
    pub fn tree(&self, node: u32, limit: usize, budget: usize, min_prob: f64) -> Result<(Vec<u32>, Vec<i64>)> {
        self.node(node)?;
        // (path probability, -order) in a max-heap; order breaks ties by push order
        let mut heap: std::collections::BinaryHeap<Entry> = std::collections::BinaryHeap::new();
        let mut order = 0u64;
        let (mut tokens, mut parents) = (Vec::new(), Vec::new());
        let mut push =
            |heap: &mut std::collections::BinaryHeap<Entry>, parent: i64, at: u32, path: f64, depth: usize| {
                if depth >= limit {
                    return;
                }
                let n = &self.nodes[at as usize];
                let mut kids: Vec<(u32, u32, u32)> = n
                    .children
                    .iter()
                    .map(|(&t, &c)| (self.nodes[c as usize].count, t, c))
                    .collect();
                kids.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                for (count, t, c) in kids {
                    let p = path * f64::from(count) / f64::from(n.total);
                    if p >= min_prob {
                        heap.push(Entry {
                            p,
                            order,
                            parent,
                            depth,
                            token: t,
                            node: c,
                        });
                        order += 1;
                    }
                }
            };
        push(&mut heap, -1, node, 1.0, 0);
        while tokens.len() < budget {
            let Some(e) = heap.pop() else { break };
            tokens.push(e.token);
            parents.push(e.parent);
            push(&mut heap, (tokens.len() - 1) as i64, e.node, e.p, e.depth + 1);
        }
        Ok((tokens, parents))
    }

    pub fn count(&self, node: u32) -> Result<u32> {
        Ok(self.node(node)?.count)
    }

    pub fn total(&self, node: u32) -> Result<u32> {
        Ok(self.node(node)?.total)
    }

    pub fn best(&self, node: u32) -> Result<Option<u32>> {
        Ok(self.node(node)?.best)
    }

    /// (token, child) pairs of `node`, by token.
    pub fn children(&self, node: u32) -> Result<Vec<(u32, u32)>> {
        let mut out: Vec<(u32, u32)> = self.node(node)?.children.iter().map(|(&t, &c)| (t, c)).collect();
        out.sort_unstable();
        Ok(out)
    }
}

struct Entry {
    p: f64,
    order: u64,
    parent: i64,
    depth: usize,
    token: u32,
    node: u32,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // larger probability first; among equals the earlier push first
        self.p.total_cmp(&other.p).then(other.order.cmp(&self.order))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_substrings_and_forgets_them() {
        let mut t = SuffixTrie::new(3).unwrap();
        t.grow(&[], &[1, 2, 1, 2, 3]).unwrap();
        let n = t.find(&[1, 2]).unwrap();
        assert_eq!(t.count(n).unwrap(), 2);
        assert_eq!(t.children(n).unwrap().len(), 2);
        assert_eq!(t.total(n).unwrap(), 2);
        assert!(t.find(&[1, 2, 1, 2]).is_none());
        t.grow(&[], &[4, 1, 2, 3]).unwrap();
        t.remove(&[1, 2, 1, 2, 3]);
        assert_eq!(t.count(t.find(&[1, 2]).unwrap()).unwrap(), 1);
        assert!(t.find(&[2, 1]).is_none());
        t.remove(&[4, 1, 2, 3]);
        assert!(t.is_empty() && t.len() == 1);
    }

    #[test]
    fn growing_by_tokens_equals_adding_at_once() {
        let seq = [5, 1, 2, 5, 1, 3, 5, 1, 2, 2];
        let mut whole = SuffixTrie::new(4).unwrap();
        whole.grow(&[], &seq).unwrap();
        let mut grown = SuffixTrie::new(4).unwrap();
        let mut state = Vec::new();
        for t in seq {
            state = grown.grow(&state, &[t]).unwrap();
        }
        for pattern in [&[5u32, 1][..], &[1, 2], &[5, 1, 2, 5], &[2, 2]] {
            let (a, b) = (whole.find(pattern).unwrap(), grown.find(pattern).unwrap());
            assert_eq!(whole.count(a).unwrap(), grown.count(b).unwrap());
        }
        assert_eq!(state.len(), 4);
        assert_eq!(state[0], grown.find(&[2]).unwrap());
    }

    #[test]
    fn the_longest_match_has_a_continuation() {
        let mut t = SuffixTrie::new(8).unwrap();
        t.grow(&[], &[7, 1, 2, 3, 9, 4, 1, 2]).unwrap();
        let (n, m) = t.longest_match(&[0, 4, 1, 2], 8);
        assert_eq!((n, m), (t.find(&[1, 2]), 2));
        assert_eq!(t.longest_match(&[6, 6], 8), (None, 0));
    }

    #[test]
    fn drafts_follow_the_most_frequent_child_above_the_threshold() {
        let mut t = SuffixTrie::new(6).unwrap();
        t.grow(&[], &[1, 2, 3, 1, 2, 3, 1, 2, 4]).unwrap();
        let n = t.find(&[1, 2]).unwrap();
        let (tokens, probs) = t.chain(n, 4, 0.1).unwrap();
        assert_eq!(tokens[0], 3);
        assert!((probs[0] - 2.0 / 3.0).abs() < 1e-12);
        let (tokens, _) = t.chain(n, 4, 0.9).unwrap();
        assert!(tokens.is_empty());
        // 3 (2/3), then what followed "1 2 3" (1: 2/3 on its path) before 4 (1/3)
        let (tree, parents) = t.tree(n, 2, 3, 0.1).unwrap();
        assert_eq!((tree, parents), (vec![3, 1, 4], vec![-1, 0, -1]));
    }

    #[test]
    fn a_stale_node_is_an_error() {
        let mut t = SuffixTrie::new(3).unwrap();
        t.grow(&[], &[1, 2]).unwrap();
        let n = t.find(&[1, 2]).unwrap();
        t.remove(&[1, 2]);
        assert!(t.count(n).is_err() && t.chain(n, 2, 0.1).is_err());
        assert!(SuffixTrie::new(1).is_err());
    }
}
