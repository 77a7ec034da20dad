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

/// The layer's cache: keys and values (kv_heads, capacity, d), positions
/// 0..past filled; this step writes past..past + n.
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

fn bad(what: String) -> SpecError {
    SpecError::Invalid(format!("llama layer: {what}"))
}

/// `x` (n, hidden), the residual stream, goes through the layer in place.
/// `cos`, `sin` (n, d): the rotary tables at the n positions (both halves).
#[allow(clippy::too_many_arguments)]
pub fn layer(
    x: &mut [f32],
    n: usize,
    cos: &[f32],
    sin: &[f32],
    cache: Cache<'_>,
    mask: Mask<'_>,
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
    let total = cache.past + n;
    if x.len() != n * h || cos.len() != n * d || sin.len() != n * d {
        return Err(bad(format!(
            "x, cos, sin hold {}, {}, {} values for n = {n}",
            x.len(),
            cos.len(),
            sin.len()
        )));
    }
    if w.attn_norm.len() != h || w.ffn_norm.len() != h {
        return Err(bad("norm weights of the wrong size".into()));
    }
    let cache_len = s.kv_heads * cache.capacity * d;
    if cache.keys.len() != cache_len || cache.values.len() != cache_len || total > cache.capacity {
        return Err(bad(format!(
            "a cache of {} values for capacity {} and {total} positions",
            cache.keys.len(),
            cache.capacity
        )));
    }
    if let Some(m) = mask {
        if m.len() != n * total {
            return Err(bad(format!(
                "mask of {} entries; expected n · (past + n) = {}",
                m.len(),
                n * total
            )));
        }
    }
    // attention
    let mut xn = vec![0.0f32; n * h];
    rms_norm(x, w.attn_norm, s.eps, &mut xn, h);
    let mut qkv = vec![0.0f32; n * (qd + 2 * kvd)];
    w.qkv.apply(&xn, &mut qkv, n, h, qd + 2 * kvd, threads, path)?;
    let row = qd + 2 * kvd;
    for i in 0..n {
        let (c, sn) = (&cos[i * d..(i + 1) * d], &sin[i * d..(i + 1) * d]);
        for head in 0..s.heads + s.kv_heads {
            rope(&mut qkv[i * row + head * d..i * row + (head + 1) * d], c, sn);
        }
        for g in 0..s.kv_heads {
            let at = (g * cache.capacity + cache.past + i) * d;
            cache.keys[at..at + d].copy_from_slice(&qkv[i * row + qd + g * d..i * row + qd + (g + 1) * d]);
            cache.values[at..at + d]
                .copy_from_slice(&qkv[i * row + qd + kvd + g * d..i * row + qd + kvd + (g + 1) * d]);
        }
    }
    let mut att = vec![0.0f32; n * qd];
    let vector = path != Path::Portable;
    attention(&qkv, &mut att, n, &cache, mask, s, threads, vector);
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
/// may attend to (grouped heads: head h reads key-value head h / group).
/// The (row, head) tasks are spread over `threads` (each writes its own
/// output slice); each task is the same computation whatever the split.
#[allow(clippy::too_many_arguments)]
fn attention(
    qkv: &[f32],
    out: &mut [f32],
    n: usize,
    cache: &Cache<'_>,
    mask: Mask<'_>,
    s: Shape,
    threads: usize,
    vector: bool,
) {
    let d = s.head_dim;
    let qd = s.heads * d;
    let total = cache.past + n;
    let tasks = n * s.heads;
    // a thread pays for itself past some thousands of key rows
    let parts = if tasks * total >= 4096 {
        threads.min(tasks).max(1)
    } else {
        1
    };
    let dst = crate::pool::SharedOut(out.as_mut_ptr());
    let keys: &[f32] = cache.keys;
    let values: &[f32] = cache.values;
    let job = |part: usize| {
        let mut scores = vec![0.0f32; total];
        for t in (part..tasks).step_by(parts) {
            let (i, head) = (t / s.heads, t % s.heads);
            // SAFETY: task t writes only out[i·qd + head·d .. + d], disjoint per task.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.at(i * qd + head * d), d) };
            attend(
                qkv,
                o,
                i,
                head,
                n,
                keys,
                values,
                cache.capacity,
                cache.past,
                mask,
                s,
                &mut scores,
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
