//! One Llama decoder layer over weights at a GGUF file's precision, for the
//! few positions of a decode or verification step (and prefill):
//! RMSNorm → q, k, v (one stacked product) → RoPE → the keys and values
//! written into the cache → attention over the cache → o → residual →
//! RMSNorm → gate, up (one stacked product) → SiLU(gate)·up → down →
//! residual. It replaces some twenty small torch operations per layer,
//! whose overhead is most of a small model's step on a CPU.
//!
//! Every value of a position is computed from that position's row alone, in
//! a fixed order (the products as in `quant.rs`, each norm, rotation,
//! softmax and weighted sum as written here), whatever the number of
//! positions or threads: a position's outputs are the same bits alone or
//! in a verification batch, so greedy speculative output equals target-only
//! greedy output by construction.
//!
//! Over 400 lines: one decoder layer's steps (norms, rotary, attention, MLP) in their
//! fixed order, read top to bottom.

use crate::error::SpecError;
use crate::quant::{qlinear, Path, QType};

/// The sizes of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub eps: f32,
}

/// A packed weight (`quant::pack`) and its format.
#[derive(Clone, Copy)]
pub struct Weight<'a> {
    pub packed: &'a [u8],
    pub q: QType,
}

/// A product whose output rows come from one weight, or from several
/// stacked in order (files mix formats: a Q4_K_M file keeps attn_v in Q6_K).
#[derive(Clone)]
pub enum Proj<'a> {
    One(Weight<'a>),
    Parts(Vec<(Weight<'a>, usize)>),
}

impl Proj<'_> {
    /// out (n, rows) = x (n, k) · Wᵀ, the parts' columns side by side.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        x: &[f32],
        out: &mut [f32],
        n: usize,
        k: usize,
        rows: usize,
        threads: usize,
        path: Path,
    ) -> crate::Result<()> {
        match self {
            Proj::One(w) => qlinear(x, w.packed, w.q, out, n, k, rows, threads, path),
            Proj::Parts(parts) => {
                if parts.iter().map(|(_, m)| m).sum::<usize>() != rows {
                    return Err(bad(format!("stacked parts do not add up to {rows} rows")));
                }
                let mut at = 0;
                for (w, m) in parts {
                    let mut part = vec![0.0f32; n * m];
                    qlinear(x, w.packed, w.q, &mut part, n, k, *m, threads, path)?;
                    for i in 0..n {
                        out[i * rows + at..i * rows + at + m].copy_from_slice(&part[i * m..(i + 1) * m]);
                    }
                    at += m;
                }
                Ok(())
            }
        }
    }
}

/// The layer's weights: q, k, v (heads·d + 2·kv_heads·d output rows), o,
/// gate and up (2·inter rows), down; the two norms' weights.
#[derive(Clone)]
pub struct Weights<'a> {
    pub qkv: Proj<'a>,
    pub o: Weight<'a>,
    pub gate_up: Proj<'a>,
    pub down: Weight<'a>,
    pub attn_norm: &'a [f32],
    pub ffn_norm: &'a [f32],
}

/// One sequence's cache in a layer: keys and values (kv_heads, capacity,
/// d), positions 0..past filled; this step writes past..past + n.
pub struct Cache<'a> {
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
    pub capacity: usize,
    pub past: usize,
}

/// Who attends to whom: `None` is causal with the n queries after the
/// `past` cached positions; `Some(mask)` is (n, past + n) bytes, nonzero =
/// attend (a tree's mask).
pub type Mask<'a> = Option<&'a [u8]>;

/// One sequence of a step: its `n` consecutive rows of x, its cache, its mask.
pub struct Segment<'a> {
    pub n: usize,
    pub cache: Cache<'a>,
    pub mask: Mask<'a>,
}

fn bad(what: String) -> SpecError {
    SpecError::Invalid(format!("llama layer: {what}"))
}

/// `x` (N, hidden), the residual stream of N = Σ n_s rows (the segments'
/// rows one after another: one sequence, or a batch of sequences of
/// ragged lengths), goes through the layer in place. `cos`, `sin` (N, d):
/// the rotary tables at each row's position (both halves). The products run
/// once over all N rows (each row's outputs from that row alone, so a
/// sequence's bits do not depend on its batch); attention runs per segment
/// over that segment's cache.
#[allow(clippy::too_many_arguments)]
pub fn layer(
    x: &mut [f32],
    cos: &[f32],
    sin: &[f32],
    segments: &mut [Segment<'_>],
    w: Weights<'_>,
    s: Shape,
    threads: usize,
    path: Path,
) -> crate::Result<()> {
    let (h, d) = (s.hidden, s.head_dim);
    if s.heads == 0 || s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) || !d.is_multiple_of(2) {
        return Err(bad(format!(
            "{} heads over {} key-value heads of size {d}",
            s.heads, s.kv_heads
        )));
    }
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let n: usize = segments.iter().map(|g| g.n).sum();
    if x.len() != n * h || cos.len() != n * d || sin.len() != n * d {
        return Err(bad(format!(
            "x, cos, sin hold {}, {}, {} values for {n} rows",
            x.len(),
            cos.len(),
            sin.len()
        )));
    }
    if w.attn_norm.len() != h || w.ffn_norm.len() != h {
        return Err(bad("norm weights of the wrong size".into()));
    }
    for (i, g) in segments.iter().enumerate() {
        let total = g.cache.past + g.n;
        let cache_len = s.kv_heads * g.cache.capacity * d;
        if g.cache.keys.len() != cache_len || g.cache.values.len() != cache_len || total > g.cache.capacity {
            return Err(bad(format!(
                "sequence {i}: a cache of {} values for capacity {} and {total} positions",
                g.cache.keys.len(),
                g.cache.capacity
            )));
        }
        if let Some(m) = g.mask {
            if m.len() != g.n * total {
                return Err(bad(format!(
                    "sequence {i}: mask of {} entries; expected n · (past + n) = {}",
                    m.len(),
                    g.n * total
                )));
            }
        }
    }
    // attention
    let mut xn = vec![0.0f32; n * h];
    rms_norm(x, w.attn_norm, s.eps, &mut xn, h);
    let row = qd + 2 * kvd;
    let mut qkv = vec![0.0f32; n * row];
    w.qkv.apply(&xn, &mut qkv, n, h, row, threads, path)?;
    let mut at = 0;
    for g in segments.iter_mut() {
        for i in 0..g.n {
            let r = at + i;
            let (c, sn) = (&cos[r * d..(r + 1) * d], &sin[r * d..(r + 1) * d]);
            for head in 0..s.heads + s.kv_heads {
                rope(&mut qkv[r * row + head * d..r * row + (head + 1) * d], c, sn);
            }
            let cache = &mut g.cache;
            for kv in 0..s.kv_heads {
                let to = (kv * cache.capacity + cache.past + i) * d;
                let from = r * row + qd + kv * d;
                cache.keys[to..to + d].copy_from_slice(&qkv[from..from + d]);
                cache.values[to..to + d].copy_from_slice(&qkv[from + kvd..from + kvd + d]);
            }
        }
        at += g.n;
    }
    let mut att = vec![0.0f32; n * qd];
    attention(&qkv, &mut att, segments, s, threads, path != Path::Portable);
    let mut o = vec![0.0f32; n * h];
    qlinear(&att, w.o.packed, w.o.q, &mut o, n, qd, h, threads, path)?;
    for (a, b) in x.iter_mut().zip(&o) {
        *a += b;
    }
    // MLP
    rms_norm(x, w.ffn_norm, s.eps, &mut xn, h);
    let mut gu = vec![0.0f32; n * 2 * s.inter];
    w.gate_up.apply(&xn, &mut gu, n, h, 2 * s.inter, threads, path)?;
    let mut act = vec![0.0f32; n * s.inter];
    for i in 0..n {
        let (gate, up) = gu[i * 2 * s.inter..(i + 1) * 2 * s.inter].split_at(s.inter);
        for j in 0..s.inter {
            let g = gate[j];
            act[i * s.inter + j] = g / (1.0 + (-g).exp()) * up[j];
        }
    }
    qlinear(&act, w.down.packed, w.down.q, &mut o, n, s.inter, h, threads, path)?;
    for (a, b) in x.iter_mut().zip(&o) {
        *a += b;
    }
    Ok(())
}

/// out = x / sqrt(mean(x²) + eps) · w, row by row (sums in index order, f32).
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], h: usize) {
    for (row, dst) in x.chunks(h).zip(out.chunks_mut(h)) {
        let mut ss = 0.0f32;
        for v in row {
            ss += v * v;
        }
        let inv = 1.0 / (ss / h as f32 + eps).sqrt();
        for j in 0..h {
            dst[j] = w[j] * (row[j] * inv);
        }
    }
}

/// RoPE in the half-split convention: x·cos + rotate_half(x)·sin.
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    for j in 0..half {
        let (a, b) = (x[j], x[j + half]);
        x[j] = a * cos[j] - b * sin[j];
        x[j + half] = b * cos[j + half] + a * sin[j + half];
    }
}

/// softmax(q·kᵀ / sqrt(d)) · v for each query row and head over the keys it
/// may attend to in its own sequence's cache (grouped heads: head h reads
/// key-value head h / group). `qkv` and `out` hold every segment's rows.
/// The (row, head) tasks of all segments are spread over `threads` (each
/// writes its own output slice); each task is the same computation whatever
/// the split.
fn attention(qkv: &[f32], out: &mut [f32], segments: &[Segment<'_>], s: Shape, threads: usize, vector: bool) {
    let d = s.head_dim;
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let width = qd + 2 * kvd;
    // each row: its segment, its index in it, the segment's first row
    let mut rows = Vec::new();
    let (mut work, mut longest, mut at) = (0, 0, 0);
    for (g, seg) in segments.iter().enumerate() {
        let total = seg.cache.past + seg.n;
        rows.extend((0..seg.n).map(|i| (g, i, at)));
        work += seg.n * s.heads * total;
        longest = longest.max(total);
        at += seg.n;
    }
    let tasks = rows.len() * s.heads;
    // a thread pays for itself past some thousands of key rows
    let parts = if work >= 4096 { threads.min(tasks).max(1) } else { 1 };
    let dst = crate::pool::SharedOut(out.as_mut_ptr());
    let job = |part: usize| {
        let mut scores = vec![0.0f32; longest];
        for t in (part..tasks).step_by(parts) {
            let (r, head) = (t / s.heads, t % s.heads);
            let (g, i, first) = rows[r];
            let seg = &segments[g];
            let (n, cache) = (seg.n, &seg.cache);
            // SAFETY: task t writes only out[r·qd + head·d .. + d], disjoint per task.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.at(r * qd + head * d), d) };
            attend(
                &qkv[first * width..(first + n) * width],
                o,
                i,
                head,
                n,
                cache.keys,
                cache.values,
                cache.capacity,
                cache.past,
                seg.mask,
                s,
                &mut scores[..cache.past + n],
                vector,
            );
        }
    };
    if parts == 1 {
        job(0);
    } else {
        crate::pool::global(threads - 1).run(parts, &job);
    }
}

/// One query row's one head.
#[allow(clippy::too_many_arguments)]
fn attend(
    qkv: &[f32],
    dst: &mut [f32],
    i: usize,
    head: usize,
    n: usize,
    keys: &[f32],
    values: &[f32],
    capacity: usize,
    past: usize,
    mask: Mask<'_>,
    s: Shape,
    scores: &mut [f32],
    vector: bool,
) {
    let d = s.head_dim;
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let row = qd + 2 * kvd;
    let total = past + n;
    let scale = 1.0 / (d as f32).sqrt();
    let q = &qkv[i * row + head * d..i * row + (head + 1) * d];
    let g = head / (s.heads / s.kv_heads);
    let keys = &keys[g * capacity * d..];
    let values = &values[g * capacity * d..];
    let mut best = f32::NEG_INFINITY;
    for (j, sc) in scores.iter_mut().enumerate() {
        let allowed = match mask {
            None => j <= past + i,
            Some(m) => m[i * total + j] != 0,
        };
        *sc = if allowed {
            dot(q, &keys[j * d..(j + 1) * d], vector) * scale
        } else {
            f32::NEG_INFINITY
        };
        best = best.max(*sc);
    }
    dst.fill(0.0);
    if best == f32::NEG_INFINITY {
        return; // attends to nothing (a padded row): zeros
    }
    let mut sum = 0.0f32;
    for sc in scores.iter_mut() {
        *sc = (*sc - best).exp();
        sum += *sc;
    }
    for (j, &p) in scores.iter().enumerate() {
        if p != 0.0 {
            axpy(p, &values[j * d..(j + 1) * d], dst, vector);
        }
    }
    let inv = 1.0 / sum;
    for a in dst.iter_mut() {
        *a *= inv;
    }
}

/// dst += p · v.
#[inline(always)]
fn axpy(p: f32, v: &[f32], dst: &mut [f32], vector: bool) {
    #[cfg(target_arch = "x86_64")]
    if vector && v.len().is_multiple_of(8) {
        // SAFETY: AVX2 and FMA are present (`vector` comes from best_path).
        unsafe { axpy_avx2(p, v, dst) };
        return;
    }
    let _ = vector;
    for (a, &b) in dst.iter_mut().zip(v) {
        *a += p * b;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(p: f32, v: &[f32], dst: &mut [f32]) {
    use std::arch::x86_64 as x;
    let pv = x::_mm256_set1_ps(p);
    for j in (0..v.len()).step_by(8) {
        let a = x::_mm256_loadu_ps(dst.as_ptr().add(j));
        let b = x::_mm256_loadu_ps(v.as_ptr().add(j));
        x::_mm256_storeu_ps(dst.as_mut_ptr().add(j), x::_mm256_fmadd_ps(pv, b, a));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64 as x;
    let mut acc = x::_mm256_setzero_ps();
    for j in (0..a.len()).step_by(8) {
        acc = x::_mm256_fmadd_ps(
            x::_mm256_loadu_ps(a.as_ptr().add(j)),
            x::_mm256_loadu_ps(b.as_ptr().add(j)),
            acc,
        );
    }
    let mut l = [0.0f32; 8];
    x::_mm256_storeu_ps(l.as_mut_ptr(), acc);
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// A dot product in 8 lanes (then pairwise): fused multiply-adds on the
/// vector path, products and sums rounded separately on the portable one
/// (a process keeps one path, so a row's result never depends on n).
#[inline(always)]
fn dot(a: &[f32], b: &[f32], vector: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if vector && a.len().is_multiple_of(8) {
        // SAFETY: AVX2 and FMA are present (`vector` comes from best_path).
        return unsafe { dot_avx2(a, b) };
    }
    let _ = vector;
    let mut l = [0.0f32; 8];
    let full = a.len() - a.len() % 8;
    for j in (0..full).step_by(8) {
        for k in 0..8 {
            l[k] += a[j + k] * b[j + k];
        }
    }
    let mut s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for j in full..a.len() {
        s += a[j] * b[j];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{best_path, pack};

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(97))
                    >> 8;
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn weight(m: usize, k: usize, seed: u32) -> Vec<u8> {
        let w: Vec<u8> = values(m * k, seed)
            .iter()
            .flat_map(|v| (v * 0.2).to_le_bytes())
            .collect();
        pack(&w, QType::F32, m, k).unwrap()
    }

    /// Two sequences in one call give each the bits it gets alone (and write
    /// the same cache entries): the products see rows, attention its own cache.
    #[test]
    fn a_sequence_has_the_same_bits_alone_or_in_a_batch() {
        let s = Shape {
            hidden: 16,
            heads: 2,
            kv_heads: 1,
            head_dim: 8,
            inter: 24,
            eps: 1e-5,
        };
        let (h, d) = (s.hidden, s.head_dim);
        let (qkv, o, gu, down) = (weight(32, h, 1), weight(h, 16, 2), weight(48, h, 3), weight(h, 24, 4));
        let norms = (values(h, 5), values(h, 6));
        let w = || Weights {
            qkv: Proj::One(Weight {
                packed: &qkv,
                q: QType::F32,
            }),
            o: Weight {
                packed: &o,
                q: QType::F32,
            },
            gate_up: Proj::One(Weight {
                packed: &gu,
                q: QType::F32,
            }),
            down: Weight {
                packed: &down,
                q: QType::F32,
            },
            attn_norm: &norms.0,
            ffn_norm: &norms.1,
        };
        let (lengths, pasts, capacity) = ([3usize, 1, 2], [4usize, 0, 7], 16);
        let caches: Vec<Vec<f32>> = (0..3).map(|i| values(capacity * d, 10 + i)).collect();
        let x = values(6 * h, 20);
        let angles = values(6 * d, 21);
        let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
        let path = best_path();
        // alone
        let mut alone = Vec::new();
        let mut at = 0;
        for i in 0..3 {
            let n = lengths[i];
            let mut xs = x[at * h..(at + n) * h].to_vec();
            let (mut k, mut v) = (caches[i].clone(), caches[i].clone());
            let mut seg = [Segment {
                n,
                cache: Cache {
                    keys: &mut k,
                    values: &mut v,
                    capacity,
                    past: pasts[i],
                },
                mask: None,
            }];
            layer(
                &mut xs,
                &cos[at * d..(at + n) * d],
                &sin[at * d..(at + n) * d],
                &mut seg,
                w(),
                s,
                2,
                path,
            )
            .unwrap();
            alone.push((xs, k, v));
            at += n;
        }
        // together
        let mut xs = x.clone();
        let mut ks: Vec<Vec<f32>> = caches.clone();
        let mut vs: Vec<Vec<f32>> = caches.clone();
        let mut segs: Vec<Segment> = ks
            .iter_mut()
            .zip(vs.iter_mut())
            .enumerate()
            .map(|(i, (k, v))| Segment {
                n: lengths[i],
                cache: Cache {
                    keys: k,
                    values: v,
                    capacity,
                    past: pasts[i],
                },
                mask: None,
            })
            .collect();
        layer(&mut xs, &cos, &sin, &mut segs, w(), s, 2, path).unwrap();
        let mut at = 0;
        for i in 0..3 {
            let n = lengths[i];
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(
                same(&xs[at * h..(at + n) * h], &alone[i].0),
                "sequence {i}: outputs differ"
            );
            assert!(
                same(&ks[i], &alone[i].1) && same(&vs[i], &alone[i].2),
                "sequence {i}: caches differ"
            );
            at += n;
        }
        // a cache too small for its sequence is an error naming it
        let (mut k, mut v) = (vec![0.0f32; 2 * d], vec![0.0f32; 2 * d]);
        let mut bad = [Segment {
            n: 3,
            cache: Cache {
                keys: &mut k,
                values: &mut v,
                capacity: 2,
                past: 0,
            },
            mask: None,
        }];
        let e = layer(
            &mut x[..3 * h].to_vec(),
            &cos[..3 * d],
            &sin[..3 * d],
            &mut bad,
            w(),
            s,
            1,
            path,
        )
        .unwrap_err();
        assert!(e.to_string().contains("sequence 0"), "{e}");
    }
}
