//! Errors of the core. Every message says what is wrong, where, what was
//! expected and how to fix it; `py/` turns each into a Python `ValueError`.

use std::fmt;

/// Where in the input a problem sits: array name, optional batch index, row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub array: &'static str,
    pub batch: Option<usize>,
    pub row: usize,
}

impl Loc {
    pub fn new(array: &'static str, batch: Option<usize>, row: usize) -> Self {
        Loc { array, batch, row }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.batch {
            Some(b) => write!(f, "{} batch {} row {}", self.array, b, self.row),
            None => write!(f, "{} row {}", self.array, self.row),
        }
    }
}

/// Everything that can go wrong on user data. No panic is ever used instead.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecError {
    /// Shapes or sizes that do not fit together.
    Shape(String),
    /// A NaN or infinite probability.
    NotFinite { loc: Loc, col: usize },
    /// A negative probability.
    Negative { loc: Loc, col: usize, value: f64 },
    /// A row whose sum is not 1 within `tol`.
    NotNormalized { loc: Loc, sum: f64, tol: f64 },
    /// A draft token id outside [0, V).
    DraftOutOfRange {
        batch: Option<usize>,
        index: usize,
        token: i64,
        vocab: usize,
    },
    /// A draft that q gives probability 0: it cannot have been sampled from q.
    ZeroDraftProb {
        batch: Option<usize>,
        index: usize,
        token: i64,
    },
    /// A row with no positive mass to sample from.
    ZeroMass { loc: Loc },
    /// Any other bad argument (already a full sentence).
    Invalid(String),
    /// The caller asked the work to stop (Ctrl-C); the Python boundary raises
    /// the pending KeyboardInterrupt instead.
    Interrupted,
}

fn at_batch(batch: Option<usize>) -> String {
    batch.map(|b| format!(" of batch {b}")).unwrap_or_default()
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::Shape(msg) | SpecError::Invalid(msg) => f.write_str(msg),
            SpecError::NotFinite { loc, col } => write!(
                f,
                "{loc} has a non-finite value (NaN or inf) at column {col}; \
                 expected probabilities in [0, 1]; pass softmax(logits) of finite logits"
            ),
            SpecError::Negative { loc, col, value } => write!(
                f,
                "{loc} has a negative probability {value:.6} at column {col}; \
                 expected probabilities >= 0; pass softmax(logits), not logits"
            ),
            SpecError::NotNormalized { loc, sum, tol } => write!(
                f,
                "{loc} sums to {sum:.6} (expected 1 ± {tol:e}); pass softmax(logits), \
                 or divide the row by its sum"
            ),
            SpecError::DraftOutOfRange {
                batch,
                index,
                token,
                vocab,
            } => write!(
                f,
                "drafts[{index}]{} = {token} is outside the vocabulary [0, {vocab}); \
                 expected token ids below V = {vocab}, the last dimension of p and q",
                at_batch(*batch)
            ),
            SpecError::ZeroDraftProb { batch, index, token } => write!(
                f,
                "drafts[{index}]{} = {token} has probability 0 under q row {index}, so it \
                 cannot have been sampled from q; pass as q_rows the distributions the \
                 drafts were actually sampled from (one-hot rows for greedy drafters)",
                at_batch(*batch)
            ),
            SpecError::Interrupted => f.write_str("interrupted before the work was done"),
            SpecError::ZeroMass { loc } => write!(
                f,
                "{loc} has no positive probability to sample from; expected a row that \
                 sums to 1"
            ),
        }
    }
}

impl std::error::Error for SpecError {}

pub type Result<T> = std::result::Result<T, SpecError>;
