//! specdec_rs core: exact speculative-sampling verification and a Monte Carlo
//! engine for toy models. p = target, q = draft, k = γ (drafts per round).
//!
//! Only `py/` (feature `python`) touches pyo3/numpy; everything else is
//! plain Rust on ndarray views, tested with `cargo test`.

pub mod attention;
pub mod block;
pub mod error;
pub mod kernels;
pub mod kquant;
pub mod kv;
pub mod linear;
pub mod llama;
pub mod names;
pub mod pool;
pub mod prob;
pub mod probe;
pub mod q8;
pub mod quant;
pub mod rng;
pub mod rowwise;
pub mod sim;
pub mod suffix;
pub mod tree;
pub mod verify;

#[cfg(feature = "python")]
mod py;

pub use error::{Loc, Result, SpecError};
pub use names::Named;
pub use rng::row_seed;
pub use sim::{simulate, simulate_round_lengths, Chain, Rounds, Sim, TreeSim, Variant};
pub use tree::{verify_tree, Children, Topology, TreeRule, Walk};
pub use verify::{verify, verify_batch, Batch, Checks, Method};
