//! Attention of a decoder step as one fused kernel: softmax(q·kᵀ · scale)·v
//! for every query row and head of every segment, over that segment's own
//! cache (causal after its past, or a tree's mask).
//!
//! A task is a segment's key-value head (its group of query heads) and a
//! chunk of its queries (rows × heads of the group): the keys are read in
//! blocks of 16, each block transposed once and multiplied into every query
//! of the chunk (16 scores per vector, no horizontal sums), and the values
//! are read once per query. The cost grows with the context at the cache's
//! memory rate.
//!
//! Every value of one query is computed in one fixed order, whatever the
//! segment's length, the mask's other rows, the chunking, the thread count
//! or the instruction path (the same lane-wise code is compiled for
//! AVX-512, AVX2 and portable): score_j = (Σ_c q_c·k_jc by fused
//! multiply-adds in c order) · scale; m = max over the allowed keys; p_j =
//! `exp(score_j − m)` (`rowwise::exp`: the same float32 operations on
//! every path); the sum of the p_j in 16 lanes (lane j mod 16, blocks in order),
//! the lanes added pairwise; out_c = Σ_j p_j·v_jc over the allowed keys in
//! order, times 1/sum. Keys a query may not see add nothing (not even a
//! zero), so a row's output is the same bits alone or in any batch or tree.

// Index loops over lanes, rows and panels read like the order they document.
#![allow(clippy::needless_range_loop)]

use crate::llama::{Segment, Shape};
use crate::pool::SharedOut;

/// Keys per block (the lanes of a score vector).
const KB: usize = 16;
/// The most queries of one task.
const CHUNK: usize = 8;

/// Whether query row i of a segment (of n rows after `past`) may see key j.
#[inline(always)]
fn allowed(mask: Option<&[u8]>, total: usize, past: usize, i: usize, j: usize) -> bool {
    match mask {
        None => j <= past + i,
        Some(m) => m[i * total + j] != 0,
    }
}

/// The attention of every segment: `qkv` (N, (heads + 2·kv) · d) the rows'
/// queries (rotated), keys and values (already in the caches); `out` (N,
/// heads · d).
pub(crate) fn attention(
    qkv: &[f32],
    out: &mut [f32],
    segments: &[Segment<'_>],
    s: Shape,
    threads: usize,
    vector: bool,
) {
    let group = s.heads / s.kv_heads;
    // tasks: (segment, its first row, kv head, first query, queries), queries as (row, head) in order
    let mut tasks = Vec::new();
    let mut at = 0;
    let mut work = 0;
    for (g, seg) in segments.iter().enumerate() {
        let queries = seg.n * group;
        // enough tasks for the threads (at least two per thread when there is work)
        let pieces = (2 * threads).div_ceil(segments.len() * s.kv_heads).max(1);
        let chunk = queries.div_ceil(pieces).clamp(1, CHUNK);
        for kv in 0..s.kv_heads {
            let mut q0 = 0;
            while q0 < queries {
                let len = chunk.min(queries - q0);
                tasks.push((g, at, kv, q0, len));
                q0 += len;
            }
        }
        work += seg.n * s.heads * (seg.cache.past + seg.n);
        at += seg.n;
    }
    // a thread pays for itself past some thousands of key rows
    let parts = if work >= 4096 {
        threads.min(tasks.len()).max(1)
    } else {
        1
    };
    let dst = SharedOut(out.as_mut_ptr());
    let job = |part: usize| {
        for &(g, first, kv, q0, len) in tasks.iter().skip(part).step_by(parts) {
            // SAFETY: each task writes only the output rows of its queries
            // (row, head) — disjoint across tasks — of `out` (N · heads · d).
            unsafe { run_task(qkv, dst, &segments[g], first, kv, q0, len, s, vector) };
        }
    };
    if parts == 1 {
        job(0);
    } else {
        crate::pool::global(threads - 1).run(parts, &job);
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn run_task(
    qkv: &[f32],
    out: SharedOut,
    seg: &Segment<'_>,
    first: usize,
    kv: usize,
    q0: usize,
    len: usize,
    s: Shape,
    vector: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if vector {
        if crate::quant::best_path().avx512() {
            return task_avx512(qkv, out, seg, first, kv, q0, len, s);
        }
        return task_avx2(qkv, out, seg, first, kv, q0, len, s);
    }
    let _ = vector;
    task(qkv, out, seg, first, kv, q0, len, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn task_avx512(
    qkv: &[f32],
    out: SharedOut,
    seg: &Segment<'_>,
    first: usize,
    kv: usize,
    q0: usize,
    len: usize,
    s: Shape,
) {
    task(qkv, out, seg, first, kv, q0, len, s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn task_avx2(
    qkv: &[f32],
    out: SharedOut,
    seg: &Segment<'_>,
    first: usize,
    kv: usize,
    q0: usize,
    len: usize,
    s: Shape,
) {
    task(qkv, out, seg, first, kv, q0, len, s)
}

/// One task (see the module docs), written lane-wise so that each path's
/// compilation vectorizes it with the same operations.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn task(
    qkv: &[f32],
    out: SharedOut,
    seg: &Segment<'_>,
    first: usize,
    kv: usize,
    q0: usize,
    len: usize,
    s: Shape,
) {
    let d = s.head_dim;
    let group = s.heads / s.kv_heads;
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let width = qd + 2 * kvd;
    let cache = &seg.cache;
    let (past, total) = (cache.past, cache.past + seg.n);
    let keys = &cache.keys[kv * cache.capacity * d..];
    let values = &cache.values[kv * cache.capacity * d..];
    let scale = 1.0 / (d as f32).sqrt();
    // the chunk's queries: (row in the segment, head)
    let mut queries = [(0usize, 0usize); CHUNK];
    for (qi, slot) in queries.iter_mut().enumerate().take(len) {
        let flat = q0 + qi;
        *slot = (flat / group, kv * group + flat % group);
    }
    let blocks = total.div_ceil(KB);
    let mut scores = vec![0.0f32; len * blocks * KB];
    let mut kt = vec![0.0f32; d * KB]; // a key block, transposed: kt[c · 16 + lane]
    for b in 0..blocks {
        let j0 = b * KB;
        let valid = KB.min(total - j0);
        for lane in 0..KB {
            for c in 0..d {
                kt[c * KB + lane] = if lane < valid { keys[(j0 + lane) * d + c] } else { 0.0 };
            }
        }
        for (qi, &(i, head)) in queries.iter().enumerate().take(len) {
            let q = &qkv[(first + i) * width + head * d..(first + i) * width + (head + 1) * d];
            let mut acc = [0.0f32; KB];
            for (c, &qc) in q.iter().enumerate() {
                let col: &[f32; KB] = kt[c * KB..(c + 1) * KB].try_into().expect("a block of 16");
                for lane in 0..KB {
                    acc[lane] = qc.mul_add(col[lane], acc[lane]);
                }
            }
            let row = &mut scores[(qi * blocks + b) * KB..(qi * blocks + b + 1) * KB];
            for lane in 0..KB {
                row[lane] = acc[lane] * scale;
            }
        }
    }
    for (qi, &(i, head)) in queries.iter().enumerate().take(len) {
        let row = &mut scores[qi * blocks * KB..(qi + 1) * blocks * KB];
        let mut best = f32::NEG_INFINITY;
        for (j, &sc) in row.iter().enumerate().take(total) {
            if allowed(seg.mask, total, past, i, j) {
                best = best.max(sc);
            }
        }
        let o = std::slice::from_raw_parts_mut(out.at((first + i) * qd + head * d), d);
        o.fill(0.0);
        if best == f32::NEG_INFINITY {
            continue; // attends to nothing (a padded row): zeros
        }
        let mut lanes = [0.0f32; KB];
        for b in 0..blocks {
            let block: &mut [f32] = &mut row[b * KB..(b + 1) * KB];
            for lane in 0..KB {
                let j = b * KB + lane;
                let p = if j < total && allowed(seg.mask, total, past, i, j) {
                    crate::rowwise::exp(block[lane] - best)
                } else {
                    0.0
                };
                block[lane] = p;
                lanes[lane] += p;
            }
        }
        let mut width16 = lanes;
        let mut w = KB;
        while w > 1 {
            w /= 2;
            for l in 0..w {
                width16[l] += width16[l + w];
            }
        }
        let sum = width16[0];
        for (j, &p) in row.iter().enumerate().take(total) {
            if allowed(seg.mask, total, past, i, j) {
                let v = &values[j * d..(j + 1) * d];
                for c in 0..d {
                    o[c] = p.mul_add(v[c], o[c]);
                }
            }
        }
        let inv = 1.0 / sum;
        for a in o.iter_mut() {
            *a *= inv;
        }
    }
}
