//! Block verification of a chain of k drafts (Sun et al., "Block Verification
//! Accelerates Speculative Decoding", ICLR 2025). p = target, q = draft, k = γ.
//!
//! Row i of p and q is conditioned on prefix + drafts[..i]. With the prefix
//! ratios r_0 = 1, r_i = min(1, r_{i−1} · p_{i−1}(x_i) / q_{i−1}(x_i)) and
//!
//!   h_i = Z_i / (Z_i + 1 − r_i),  Z_i = Σ_x max(0, r_i · p_i(x) − q_i(x))   (i < k),
//!   h_k = r_k,
//!
//! the round keeps τ = max{i : η_i < h_i} drafts (τ = 0 if none; η_i are k
//! independent uniforms), then emits a token from norm(max(0, r_τ · p_τ − q_τ))
//! when τ < k, or from p_k (the bonus) when τ = k. The output law is the
//! target's, and E[τ] is never below token-wise verification's for the same
//! rows. τ is found from the top down, so a round reads only the rows
//! k − 1, …, τ (one pass each) and the row its last token comes from.

use rand::RngExt;

use crate::error::{Result, SpecError};
use crate::prob::{check_entry, pick_residual, residual_weights_scaled, sample_row, Prob, Residual, Row};
use crate::rng::Stream;

/// One block-verified round: (τ, the last token). `x(i)` is draft i, `p_row(i)`
/// for i in 0..=k and `q_row(i)` for i in 0..k the rows; `batch` labels errors.
pub fn block_round<'a, P: Prob, Q: Prob>(
    k: usize,
    x: impl Fn(usize) -> usize,
    p_row: impl Fn(usize) -> Row<'a, P>,
    q_row: impl Fn(usize) -> Row<'a, Q>,
    rng: &mut Stream,
    batch: Option<usize>,
) -> Result<(usize, usize)> {
    let mut ratio = Vec::with_capacity(k + 1);
    ratio.push(1.0f64);
    for i in 0..k {
        let (p, q, xi) = (p_row(i), q_row(i), x(i));
        let (px, qx) = (p.data[xi].to_f64(), q.data[xi].to_f64());
        check_entry(px, p.loc, xi)?;
        check_entry(qx, q.loc, xi)?;
        if qx <= 0.0 {
            return Err(SpecError::ZeroDraftProb {
                batch,
                index: i,
                token: xi as i64,
            });
        }
        ratio.push((ratio[i] * px / qx).min(1.0));
    }
    let eta: Vec<f64> = (0..k).map(|_| rng.random()).collect();
    let mut kept = 0;
    let mut residual = None;
    for i in (1..=k).rev() {
        if i == k {
            if eta[k - 1] < ratio[k] {
                kept = k;
                break;
            }
            continue;
        }
        let r = residual_weights_scaled(p_row(i), q_row(i), ratio[i], 1.0)?;
        let z = match &r {
            Residual::Mass { w, .. } => w.total,
            Residual::FromP(_) => 0.0,
        };
        let denom = z + 1.0 - ratio[i];
        let h = if denom > 0.0 { z / denom } else { 1.0 };
        if eta[i - 1] < h {
            kept = i;
            residual = Some(r);
            break;
        }
    }
    let u: f64 = rng.random();
    if kept == k {
        return Ok((k, sample_row(p_row(k), u)?));
    }
    let (p, q) = (p_row(kept), q_row(kept));
    let r = match residual {
        Some(r) => r,
        None => residual_weights_scaled(p, q, ratio[kept], 1.0)?,
    };
    Ok((kept, pick_residual(p.data, q.data, &r, u)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Loc;
    use crate::rng::stream;

    fn rows<'a>(data: &'a [Vec<f64>]) -> impl Fn(usize) -> Row<'a, f64> + 'a {
        move |i| Row::new(&data[i], Loc::new("p_rows", None, i), 1e-9)
    }

    #[test]
    fn equal_rows_keep_every_draft() {
        let p = vec![vec![0.25; 4]; 4];
        let q = vec![vec![0.25; 4]; 3];
        for seed in 0..100 {
            let (kept, _) = block_round(3, |i| i, rows(&p), rows(&q), &mut stream(seed), None).unwrap();
            assert_eq!(kept, 3);
        }
    }

    #[test]
    fn a_later_draft_can_rescue_an_earlier_poor_ratio() {
        // Draft 0 has ratio 0.5; draft 1 has p/q = 2, so r_2 = 1 and the
        // block keeps both drafts whenever η_2 < 1: always.
        let p = vec![vec![0.25, 0.75], vec![0.8, 0.2], vec![0.5, 0.5]];
        let q = vec![vec![0.5, 0.5], vec![0.4, 0.6]];
        for seed in 0..200 {
            let (kept, _) = block_round(2, |_| 0, rows(&p), rows(&q), &mut stream(seed), None).unwrap();
            assert_eq!(kept, 2, "seed {seed}");
        }
    }

    #[test]
    fn a_zero_draft_probability_is_an_error() {
        let p = vec![vec![0.5, 0.5]; 2];
        let q = vec![vec![1.0, 0.0]];
        let err = block_round(1, |_| 1, rows(&p), rows(&q), &mut stream(0), None).unwrap_err();
        assert!(matches!(err, SpecError::ZeroDraftProb { index: 0, .. }));
    }
}
