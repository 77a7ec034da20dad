//! Attention of a decoder step as one fused kernel: softmax(q·kᵀ · scale)·v
//! for every query row and head of every segment, over that segment's own
//! cache (causal after its past, or a tree's mask).
//!
//! A query's keys are taken in **chunks** of `CHUNK` positions (keys
//! 0..256, 256..512, ...: fixed by position, not by the call). A task is a
//! segment's key-value head with its queries (rows × the heads of its
//! group, or a share of them) over a range of chunks: the keys are read in
//! blocks of 16, each block transposed once (d × 16) and multiplied into
//! every query of the task (16 scores a vector, no horizontal sums); the
//! values are read once per pass of up to 6 queries (head size 64; 3 at
//! 128, 4 at others), each value row converted once for the pass. The common head sizes
//! have tiles of their own whose sums stay in registers. A decoding step
//! after a long context (few queries, many keys) splits each head's chunks
//! among the threads; the chunks are then combined. Under a mask, the run
//! of keys a row sees entirely is not looked up. The cost grows with the
//! context at about the cache's memory rate.
//!
//! Every value of one query is computed in one fixed order, whatever the
//! segment's length, the other rows' masks, the split into tasks, the
//! thread count or the instruction path (the same lane-wise code is
//! compiled for AVX-512, AVX2 and portable). In each chunk c of the keys
//! the query may see: score_j = (Σ_i q_i·k_ji by fused multiply-adds in i
//! order) · scale (then c·tanh(score_j/c) where the layer soft-caps); m_c = the largest score of those keys; p_j =
//! `rowwise::exp(score_j − m_c)`; s_c = the sum of the p_j in 16 lanes
//! (lane j mod 16, blocks in order), the lanes added pairwise; a_c,i =
//! Σ_j p_j·v_ji by fused multiply-adds over those keys in order. Then, over
//! the chunks in order: M = max m_c; w_c = `rowwise::exp(m_c − M)`; S =
//! s_first · w_first, then S = fma(w_c, s_c, S); o_i likewise from the
//! a_c,i; out_i = o_i · (1/S). With one chunk (a context of at most 256
//! positions) w = 1 and this is the plain softmax. Keys a query may not see
//! add nothing (not even a zero), and a chunk with none it may see is left
//! out, so a row's output is the same bits alone or in any batch. Under a
//! tree's (or lookahead window's) mask, "key j" above means the row's j-th
//! visible key in ascending slots (lanes j mod 16, chunks j / 256): a row of
//! a later branch, whose ancestors sit at other slots than its path's
//! positions, then computes what its path's causal row computes, bit for bit
//! (`own_order_chunk`: each chunk run under the mask of each row's keys of
//! that chunk in its own order, its s_c taken again by the row's lanes).
//!
//! With q8 activations and a q8_0 cache (`Act::Q8`), score_j is instead the
//! integer block product of the quantized query and the key's codes, as
//! llama.cpp computes it over a q8_0 key cache (`q8_scores`' module docs:
//! the same bits on every path); the chunks, softmax and values are as
//! above.

// Index loops over lanes, keys and dimensions read like the order they document.
#![allow(clippy::needless_range_loop)]

use crate::kv::{Kv, Lanes, Stored, Q8};
use crate::llama::{Segment, Shape};
use crate::pool::SharedOut;
use crate::quant::{Act, Path};
use crate::rowwise::exp;
use q8_scores::{Q8Queries, Q8View};

mod q8_scores;

/// Keys per block (the lanes of a score vector).
const KB: usize = 16;
/// Queries whose scores a key block feeds at once (accumulators).
const QB: usize = 8;
/// Key blocks a step of the scores may take (transposed side by side).
const KT_BLOCKS: usize = 2;
/// Queries a value row feeds at once (head sizes without a tile of their own).
const VB: usize = 4;
/// The largest head size.
pub(crate) const DMAX: usize = 256;
/// Key blocks ahead whose keys (and values) a pass requests before reading them (`fetch_rows`).
const AHEAD: usize = 2;
/// Keys per chunk (a multiple of `KB`): chunk c holds positions c·CHUNK..(c + 1)·CHUNK.
pub(crate) const CHUNK: usize = 256;

/// Gemma 2's soft-capping (`Shape::softcap`) of a chunk's `len` scaled
/// scores in place, c·tanh(score/c) (transformers' order), scalar code:
/// the same bits on every path. Nothing when c is 0.
#[inline(always)]
unsafe fn soft_cap(scores: *mut f32, len: usize, cap: f32) {
    if cap > 0.0 {
        for x in std::slice::from_raw_parts_mut(scores, len) {
            *x = cap * (*x / cap).tanh();
        }
    }
}

/// Whether query row i of a segment (of n rows after `past`) may see key j.
#[inline(always)]
fn allowed(mask: Option<&[u8]>, total: usize, past: usize, i: usize, j: usize) -> bool {
    match mask {
        None => j <= past + i,
        Some(m) => m[i * total + j] != 0,
    }
}

/// The (n, past + n) mask of a causal segment under a sliding window of
/// `window` positions (row i at position past + i sees keys j with
/// j <= past + i < j + window), or None where every earlier key is in it
/// (`window` 0: no window; a tree's mask is the segment's own, checked by
/// `llama::layer`).
fn window_mask(seg: &Segment<'_>, window: usize) -> Option<Vec<u8>> {
    let (past, n) = (seg.cache.past, seg.n);
    let total = past + n;
    if window == 0 || seg.mask.is_some() || total <= window {
        return None;
    }
    let mut mask = vec![0u8; n * total];
    for i in 0..n {
        let at = past + i;
        for j in (at + 1).saturating_sub(window)..=at {
            mask[i * total + j] = 1;
        }
    }
    Some(mask)
}

/// The attention of every segment: `qkv` (N, (heads + 2·kv) · d) the rows'
/// queries (rotated), keys and values (already in the caches); `out` (N,
/// heads · d). With q8 activations (`act`) a q8_0 cache's scores are
/// integer block products of the quantized query (`q8_scores`).
pub fn attention(
    qkv: &[f32],
    out: &mut [f32],
    segments: &[Segment<'_>],
    s: Shape,
    threads: usize,
    path: Path,
    act: Act,
) {
    let group = s.heads / s.kv_heads;
    // a sliding window (`Shape::window`) is a mask of the keys each row of a causal segment sees
    let windowed: Vec<Option<Vec<u8>>> = segments.iter().map(|seg| window_mask(seg, s.window)).collect();
    let masks: Vec<Option<&[u8]>> = segments
        .iter()
        .zip(&windowed)
        .map(|(seg, w)| w.as_deref().or(seg.mask))
        .collect();
    // with q8 activations, a q8_0 cache's queries quantized once, per
    // segment and key-value head in task order (rows × the group's heads)
    let width = (s.heads + 2 * s.kv_heads) * s.head_dim;
    let mut quantized: Vec<Option<Q8Queries>> = Vec::new();
    let mut first = 0;
    for seg in segments {
        let integer = act == Act::Q8 && matches!(seg.cache.kv, Kv::Q8 { .. });
        for kv in 0..s.kv_heads {
            quantized.push(integer.then(|| {
                let d = s.head_dim;
                let mut rows = Vec::with_capacity(seg.n * group * d);
                for flat in 0..seg.n * group {
                    let (i, head) = (flat / group, kv * group + flat % group);
                    let at = (first + i) * width + head * d;
                    rows.extend_from_slice(&qkv[at..at + d]);
                }
                Q8Queries::of(&rows, d)
            }));
        }
        first += seg.n;
    }
    // tasks: (segment, its first row, kv head, first query, queries); a query is (row, head) in order
    // a task transposes its keys once for all its queries: split a head's
    // queries only when there are many (the threads then share the work)
    let spread = (2 * threads).div_ceil(segments.len() * s.kv_heads).max(1);
    let mut heads = Vec::new();
    let (mut at, mut work) = (0, 0);
    for (g, seg) in segments.iter().enumerate() {
        let queries = seg.n * group;
        let pieces = if queries > 2 * QB { spread } else { 1 };
        let share = queries.div_ceil(pieces).max(1);
        for kv in 0..s.kv_heads {
            let mut q0 = 0;
            while q0 < queries {
                let len = share.min(queries - q0);
                heads.push((g, at, kv, q0, len));
                q0 += len;
            }
        }
        work += seg.n * s.heads * (seg.cache.past + seg.n);
        at += seg.n;
    }
    // a second thread pays for itself past about a thousand query-key pairs (a
    // decoding step after 128 positions: its cache is cold after the weights streamed)
    let parallel = work >= 1024 && threads > 1;
    // few tasks over many chunks (decoding after a long context): each
    // task's chunks are shared among the threads and combined afterwards
    let chunks_of = |g: usize| (segments[g].cache.past + segments[g].n).div_ceil(CHUNK).max(1);
    let most = (0..segments.len()).map(chunks_of).max().unwrap_or(1);
    let ways = if parallel && most > 1 && heads.len() < 4 * threads {
        most // a task a chunk: the threads take them as they finish (`next`), evenly
    } else {
        1
    };
    let mut tasks = Vec::with_capacity(heads.len() * ways);
    for &(g, first, kv, q0, len) in &heads {
        let all = chunks_of(g);
        let each = all.div_ceil(ways);
        let mut c0 = 0;
        while c0 < all {
            tasks.push((g, first, kv, q0, len, (c0, (c0 + each).min(all))));
            c0 += each;
        }
    }
    let parts = if parallel { threads.min(tasks.len()).max(1) } else { 1 };
    let d = s.head_dim;
    let stride = d + 2;
    let mut scratch = if ways > 1 {
        vec![0.0f32; (out.len() / d.max(1)) * most * stride]
    } else {
        Vec::new()
    };
    let partials = (ways > 1).then_some((SharedOut(scratch.as_mut_ptr()), most));
    let dst = SharedOut(out.as_mut_ptr());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let job = |_: usize| {
        while let Some(&(g, first, kv, q0, len, chunks)) =
            tasks.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        {
            let t = Task {
                seg: &segments[g],
                mask: masks[g],
                q8: quantized[g * s.kv_heads + kv].as_ref(),
                first,
                kv,
                q0,
                len,
                s,
                chunks,
            };
            // SAFETY: each task writes only the output rows of its queries
            // (row, head), or their partials of its own chunks, disjoint
            // across tasks, of `out` (N · heads · d) or `scratch`.
            unsafe { run(qkv, dst, partials, t, path) };
        }
    };
    if parts == 1 {
        job(0);
    } else {
        crate::pool::global(threads - 1).run(parts, &job);
    }
    if let Some((scratch, most)) = partials {
        let mut row = 0;
        for (g, seg) in segments.iter().enumerate() {
            for i in 0..seg.n {
                for head in 0..s.heads {
                    let query = (row + i) * s.heads + head;
                    // SAFETY: every task has written its chunks' partials of this query
                    unsafe {
                        combine(
                            scratch.at(query * most * stride),
                            chunks_of(g),
                            d,
                            dst.at(query * d),
                            path,
                        )
                    };
                }
            }
            row += seg.n;
        }
    }
}

#[derive(Clone, Copy)]
struct Task<'a, 'b> {
    seg: &'a Segment<'b>,
    /// The segment's mask, or its sliding window's (None: causal).
    mask: Option<&'a [u8]>,
    /// Its key-value head's queries quantized, where the scores are integer
    /// block products (q8 activations, a q8_0 cache: `q8_scores`).
    q8: Option<&'a Q8Queries>,
    first: usize,
    kv: usize,
    q0: usize,
    len: usize,
    s: Shape,
    /// The chunks of keys it takes, c0..c1 (all of them: it writes the outputs).
    chunks: (usize, usize),
}

/// A task's scratch: its queries' scores over one chunk and transposed key
/// blocks. Every entry a task reads it has written first.
struct Buffers {
    scores: Vec<f32>,
    kt: Vec<f32>,
}

/// Scratch entries a thread keeps between tasks (1 MiB).
const KEPT: usize = 1 << 18;

impl Buffers {
    /// At least `scores` and `kt` entries.
    fn fit(&mut self, scores: usize, kt: usize) {
        if self.scores.len() < scores {
            self.scores.resize(scores, 0.0);
        }
        if self.kt.len() < kt {
            self.kt.resize(kt, 0.0);
        }
    }

    /// Gives back a large prefill's scratch.
    fn trim(&mut self) {
        if self.scores.len() > KEPT {
            self.scores = Vec::new();
        }
    }
}

thread_local! {
    /// Each thread's scratch, reused by its tasks (no allocation or zeroing per task).
    static SCRATCH: std::cell::RefCell<Buffers> =
        const { std::cell::RefCell::new(Buffers { scores: Vec::new(), kt: Vec::new() }) };
}

/// A task: each of its chunks' partials, then (when it holds every chunk)
/// each query's output. `partials` (scratch, most): where the partials go
/// when the chunks are split among tasks (query · most + chunk, d + 2 each).
unsafe fn run(qkv: &[f32], out: SharedOut, partials: Option<(SharedOut, usize)>, t: Task<'_, '_>, path: Path) {
    let s = t.s;
    let d = s.head_dim;
    let stride = d + 2;
    let q = queries(qkv, t);
    let (c0, c1) = t.chunks;
    let count = c1 - c0;
    let mut local = if partials.is_none() {
        vec![0.0f32; t.len * count * stride]
    } else {
        Vec::new()
    };
    let base = SharedOut(local.as_mut_ptr());
    let at: Vec<*mut f32> = (0..t.len)
        .map(|qi| match partials {
            Some((scratch, most)) => {
                let (i, head) = q.rows[qi];
                scratch.at((((t.first + i) * s.heads + head) * most + c0) * stride)
            }
            None => base.at(qi * count * stride),
        })
        .collect();
    let own = q.extras.iter().any(|e| !e.is_empty());
    // own order: a chunk's keys may reach n slots past it (`own_order_chunk`)
    let most_keys = if own { CHUNK + t.seg.n + KB } else { CHUNK };
    let total = t.seg.cache.past + t.seg.n;
    // the chunks wholly inside every own-order row's run are the slots' chunks
    let first_own = (0..t.len)
        .filter(|&qi| !q.extras[qi].is_empty())
        .map(|qi| q.run[qi] / CHUNK)
        .min()
        .unwrap_or(usize::MAX);
    SCRATCH.with_borrow_mut(|buf| {
        buf.fit(t.len * most_keys, d * KB * KT_BLOCKS);
        for c in c0..c1 {
            if own && c >= first_own {
                own_order_chunk(t, &q, c, &at, (c - c0) * stride, buf, path);
                continue;
            }
            let keys = (c * CHUNK, ((c + 1) * CHUNK).min(total));
            chunk(t, &q, keys, &at, (c - c0) * stride, buf, path);
        }
        buf.trim();
    });
    if partials.is_none() {
        for qi in 0..t.len {
            let (i, head) = q.rows[qi];
            combine(at[qi], count, d, out.at((t.first + i) * s.heads * d + head * d), path);
        }
    }
}

/// A task's key-value head in its segment's cache: its first key and
/// value (positions d apart), in the cache's stored type.
#[derive(Clone, Copy)]
struct Head<T> {
    keys: *const T,
    values: *const T,
}

impl<T: Stored> Head<T> {
    /// Key-value head `kv` of buffers holding `capacity` rows of d values each.
    unsafe fn at(keys: *const T, values: *const T, kv: usize, capacity: usize, d: usize) -> Head<T> {
        let first = kv * capacity * T::row_len(d);
        Head {
            keys: keys.add(first),
            values: values.add(first),
        }
    }
}

/// One chunk of a task's keys, `keys` = (k0, k1), on the path's code:
/// each query's partial (m, s, a: see the module docs) at `at[qi] + off`,
/// m = −∞ where it sees none of these keys.
#[allow(clippy::too_many_arguments)]
unsafe fn chunk(
    t: Task<'_, '_>,
    q: &Queries,
    keys: (usize, usize),
    at: &[*mut f32],
    off: usize,
    buf: &mut Buffers,
    path: Path,
) {
    let (kv, capacity, d) = (t.kv, t.seg.cache.capacity, t.s.head_dim);
    match &t.seg.cache.kv {
        Kv::F32 { keys: k, values: v } => {
            let head = Head::at(k.as_ptr(), v.as_ptr(), kv, capacity, d);
            chunk_of(t, head, q, keys, at, off, buf, path)
        }
        Kv::F16 { keys: k, values: v } => {
            let head = Head::at(k.as_ptr(), v.as_ptr(), kv, capacity, d);
            chunk_of(t, head, q, keys, at, off, buf, path)
        }
        Kv::Q8 { keys: k, values: v } => {
            let head = Head::at(k.as_ptr() as *const Q8, v.as_ptr() as *const Q8, kv, capacity, d);
            if let Some(q8) = &q.q8 {
                // the scores first, by integer block products; the kernel then skips its own
                let (b0, b1) = chunk_blocks(q, keys);
                let total = t.seg.cache.past + t.seg.n;
                let span = (b1 - b0) * KB;
                let out = buf.scores.as_mut_ptr();
                q8_scores::scores(
                    head.keys as *const u8,
                    d,
                    total,
                    (b0, b1),
                    q8,
                    t.s.scale,
                    out,
                    span,
                    path,
                );
            }
            chunk_of(t, head, q, keys, at, off, buf, path)
        }
    }
}

/// `chunk` on the cache's stored type and the path's code.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn chunk_of<T: Lanes>(
    t: Task<'_, '_>,
    head: Head<T>,
    q: &Queries,
    keys: (usize, usize),
    at: &[*mut f32],
    off: usize,
    buf: &mut Buffers,
    path: Path,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if path.avx512() && t.s.head_dim.is_multiple_of(KB) {
            return x86::chunk_avx512(t, head, q, keys, at, off, buf);
        }
        if path.vector() && t.s.head_dim.is_multiple_of(8) {
            return x86_avx2::chunk_avx2(t, head, q, keys, at, off, buf);
        }
        if path.vector() {
            return chunk_fma(t, head, q, keys, at, off, buf);
        }
    }
    let _ = path;
    chunk_lanes(t, head, q, keys, at, off, buf)
}

/// Chunk c of a task whose segment has its own mask (a tree's, a lookahead
/// window's) and rows whose keys are not one run from the first
/// (`Queries::extras`: a later branch's ancestors). Each such row takes
/// its keys in their own order: key v of the row (v = 0, 1, ...: the run,
/// then the extras) in chunk v / CHUNK and lane v mod 16, as its path's
/// causal row at position v takes key v. The kernel runs over the slots
/// that may hold chunk c's keys of some row (c·CHUNK up to (c + 1)·CHUNK +
/// n: a row's key sits at most n − 1 slots past its place) under the mask
/// of each row's keys of chunk c; its max, p_j and value sums are then the
/// row's (the kernels take keys in ascending slots, which is their order),
/// and the sum s_c is taken again by the row's own lanes. Other rows get
/// the slots' chunks, as without a mask.
unsafe fn own_order_chunk(
    t: Task<'_, '_>,
    q: &Queries,
    c: usize,
    at: &[*mut f32],
    off: usize,
    buf: &mut Buffers,
    path: Path,
) {
    let (n, past) = (t.seg.n, t.seg.cache.past);
    let total = past + n;
    let mask = t.mask.unwrap_or(&[]);
    let (k0, k1) = (c * CHUNK, ((c + 1) * CHUNK + n).min(total));
    let end = (c + 1) * CHUNK;
    // each row's keys of chunk c, as a mask (n × total)
    let mut mine = vec![0u8; n * total];
    let mut rows_done = vec![false; n];
    for qi in 0..t.len {
        let i = q.rows[qi].0;
        if std::mem::replace(&mut rows_done[i], true) {
            continue;
        }
        let row = &mut mine[i * total..(i + 1) * total];
        let (run, extras) = (q.run[qi], &q.extras[qi]);
        if extras.is_empty() {
            for j in k0..end.min(total) {
                row[j] = mask[i * total + j];
            }
        } else {
            row[k0.min(run)..end.min(run)].fill(1);
            for (rank, &j) in extras.iter().enumerate() {
                if (run + rank) / CHUNK == c {
                    row[j] = 1;
                }
            }
        }
    }
    let view = Queries {
        q8: q.q8,
        rows: q.rows.clone(),
        qptr: q.qptr.clone(),
        limit: q.limit.clone(),
        run: q.run.iter().map(|&r| r.min(end)).collect(),
        extras: vec![Vec::new(); t.len],
    };
    let tc = Task { mask: Some(&mine), ..t };
    chunk(tc, &view, (k0, k1), at, off, buf, path);
    // s_c by each own-order row's lanes, from the p_j the kernel left
    let (b0, b1) = chunk_blocks(&view, (k0, k1));
    let span = (b1 - b0) * KB;
    for qi in 0..t.len {
        let (run, extras) = (q.run[qi], &q.extras[qi]);
        let part = at[qi].add(off);
        if extras.is_empty() || *part == f32::NEG_INFINITY {
            continue;
        }
        let own = |v: usize| if v < run { v } else { extras[v - run] };
        let mut lanes = [0.0f32; KB];
        for v in k0..end.min(run + extras.len()) {
            lanes[v % KB] += buf.scores[qi * span + own(v) - k0];
        }
        *part.add(1) = pairwise(lanes);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_fma<T: Lanes>(
    t: Task<'_, '_>,
    head: Head<T>,
    q: &Queries,
    keys: (usize, usize),
    at: &[*mut f32],
    off: usize,
    buf: &mut Buffers,
) {
    chunk_lanes(t, head, q, keys, at, off, buf)
}

/// A query's output (d values at `o`) from its `count` chunks' partials at
/// `part` (d + 2 apart), in the order the module docs give.
unsafe fn combine(part: *const f32, count: usize, d: usize, o: *mut f32, path: Path) {
    #[cfg(target_arch = "x86_64")]
    {
        if path.vector() {
            return combine_fma(part, count, d, o);
        }
    }
    let _ = path;
    combine_lanes(part, count, d, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn combine_fma(part: *const f32, count: usize, d: usize, o: *mut f32) {
    combine_lanes(part, count, d, o)
}

#[inline(always)]
unsafe fn combine_lanes(part: *const f32, count: usize, d: usize, o: *mut f32) {
    let stride = d + 2;
    let o = std::slice::from_raw_parts_mut(o, d);
    let mut top = f32::NEG_INFINITY;
    for c in 0..count {
        let m = *part.add(c * stride);
        if m != f32::NEG_INFINITY {
            top = top.max(m);
        }
    }
    if top == f32::NEG_INFINITY {
        o.fill(0.0); // attends to nothing (a padded row): zeros
        return;
    }
    // the weighted sums are taken in `o` itself (every entry written by the first chunk seen)
    let mut sum = 0.0f32;
    let mut first = true;
    for c in 0..count {
        let p = part.add(c * stride);
        if *p == f32::NEG_INFINITY {
            continue; // a chunk it sees nothing of
        }
        let w = exp(*p - top);
        let a = std::slice::from_raw_parts(p.add(2), d);
        if first {
            sum = *p.add(1) * w;
            for i in 0..d {
                o[i] = a[i] * w;
            }
            first = false;
        } else {
            sum = w.mul_add(*p.add(1), sum);
            for i in 0..d {
                o[i] = w.mul_add(a[i], o[i]);
            }
        }
    }
    if sum == 0.0 {
        o.fill(0.0);
        return;
    }
    let inv = 1.0 / sum;
    for v in o.iter_mut() {
        *v *= inv;
    }
}

/// Keys j0..j0 + 16 (zeros past `total`) of the rows at `keys` (d values
/// each) transposed into `kt` (d × 16).
///
/// # Safety
/// `keys` holds rows 0..total.
#[inline(always)]
pub(crate) unsafe fn transpose<T: Stored>(keys: *const T, d: usize, j0: usize, total: usize, kt: &mut [f32]) {
    let valid = KB.min(total - j0);
    for c0 in (0..d).step_by(KB) {
        let width = KB.min(d - c0);
        let mut tile = [[0.0f32; KB]; KB]; // [key][dim]
        for lane in 0..valid {
            let row = keys.add((j0 + lane) * T::row_len(d));
            for (c, t) in tile[lane][..width].iter_mut().enumerate() {
                *t = T::get(row, c0 + c);
            }
        }
        for cc in 0..width {
            let col: &mut [f32] = &mut kt[(c0 + cc) * KB..(c0 + cc + 1) * KB];
            for lane in 0..KB {
                col[lane] = tile[lane][cc];
            }
        }
    }
}

/// The 16 lanes of a softmax sum added pairwise (the documented order).
#[inline(always)]
fn pairwise(mut lanes: [f32; KB]) -> f32 {
    let mut w = KB;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
    }
    lanes[0]
}

/// A task's queries: each one's (row, head), vector, the end of the keys
/// it may see (`limit`: past the last one; 0 for none) and of the run of
/// keys from the first that it sees every one of (`run`: causal, `limit`;
/// a tree's row, at least its past).
struct Queries<'a> {
    rows: Vec<(usize, usize)>,
    qptr: Vec<*const f32>,
    limit: Vec<usize>,
    run: Vec<usize>,
    /// Under a segment's own mask (a tree's, a lookahead window's), for a
    /// row that sees the first key, the keys past `run` it sees, ascending
    /// (empty for most: see `own_order_chunk`).
    extras: Vec<Vec<usize>>,
    /// The queries quantized, where the scores are integer block products
    /// (`Task::q8`): `chunk` writes the scores, the kernels skip theirs.
    q8: Option<Q8View<'a>>,
}

fn queries<'a>(qkv: &[f32], t: Task<'a, '_>) -> Queries<'a> {
    let s = t.s;
    let (d, group) = (s.head_dim, s.heads / s.kv_heads);
    let width = (s.heads + 2 * s.kv_heads) * d;
    let (mask, past) = (t.mask, t.seg.cache.past);
    let total = past + t.seg.n;
    let mut q = Queries {
        rows: vec![(0, 0); t.len],
        qptr: vec![qkv.as_ptr(); t.len],
        limit: vec![0; t.len],
        run: vec![0; t.len],
        extras: vec![Vec::new(); t.len],
        q8: None,
    };
    for qi in 0..t.len {
        let flat = t.q0 + qi;
        let (i, head) = (flat / group, t.kv * group + flat % group);
        q.rows[qi] = (i, head);
        q.qptr[qi] = qkv[(t.first + i) * width + head * d..].as_ptr();
        q.limit[qi] = match mask {
            None => past + i + 1,
            Some(_) => (0..total)
                .rev()
                .find(|&j| allowed(mask, total, past, i, j))
                .map_or(0, |j| j + 1),
        };
        q.run[qi] = match mask {
            None => q.limit[qi],
            Some(_) => (0..total).find(|&j| !allowed(mask, total, past, i, j)).unwrap_or(total),
        };
        // own order for the rows that see the first key (a tree's, a lookahead
        // window's: the whole past); a band (a window) keeps the slots' order
        if t.seg.mask.is_some() && q.run[qi] > 0 && q.limit[qi] > q.run[qi] {
            q.extras[qi] = (q.run[qi]..q.limit[qi])
                .filter(|&j| allowed(mask, total, past, i, j))
                .collect();
        }
    }
    q.q8 = t.q8.map(|all| all.view(t.q0, t.len));
    q
}

/// The lanes of key block `b` that query row i (the keys it sees every
/// one of ending at `run`) may see, as a 16-bit mask: those of the run,
/// then (a mask) the rest looked up.
#[inline(always)]
fn seen_lanes(mask: Option<&[u8]>, total: usize, past: usize, i: usize, run: usize, b: usize) -> u16 {
    let full = run.saturating_sub(b * KB).min(KB);
    let mut bits = ((1u32 << full) - 1) as u16;
    if mask.is_none() || full == KB {
        return bits; // causal: the run is every key it sees
    }
    for lane in full..KB {
        let j = b * KB + lane;
        if j < total && allowed(mask, total, past, i, j) {
            bits |= 1 << lane;
        }
    }
    bits
}

/// Of the keys k0..k1 of a chunk, those k0..common every query of a value
/// pass (queries q0..q0 + qn) sees (the shortest of their runs), and the
/// end of those any sees.
#[inline(always)]
fn value_keys(q: &Queries, q0: usize, qn: usize, k0: usize, k1: usize) -> (usize, usize) {
    let last = q.limit[q0..q0 + qn].iter().copied().max().unwrap_or(0).clamp(k0, k1);
    let common = q.run[q0..q0 + qn].iter().copied().min().unwrap_or(0).clamp(k0, last);
    (common, last)
}

/// The blocks b0..b1 of a chunk's keys (k0, k1) that some query of the task
/// may see (b1 = b0: none).
#[inline(always)]
fn chunk_blocks(q: &Queries, (k0, k1): (usize, usize)) -> (usize, usize) {
    let top = q.limit.iter().copied().max().unwrap_or(0).clamp(k0, k1);
    (k0 / KB, top.div_ceil(KB))
}

/// The key blocks b0..b1 whose scores a kernel computes: none where
/// `chunk` wrote them (q8 queries against a q8_0 cache, `q8_scores`).
#[inline(always)]
fn unscored(q: &Queries, b0: usize, b1: usize) -> std::ops::Range<usize> {
    if q.q8.is_some() {
        b1..b1
    } else {
        b0..b1
    }
}

/// Marks a query's partial as seeing no key of the chunk.
#[inline(always)]
unsafe fn nothing(part: *mut f32) {
    *part = f32::NEG_INFINITY;
    *part.add(1) = 0.0;
}

/// Rows j0..j0 + rows of d elements each at `base` requested into L1
/// ahead of their reads (`AHEAD`; a prefetch past the cache's end never
/// faults). The hardware's stream prefetchers start late on a task's short
/// runs of keys: with this a decoding step's attention after 2,048
/// positions reads its cache about 20% faster.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fetch_rows<T: Stored>(base: *const T, d: usize, j0: usize, rows: usize) {
    use std::arch::x86_64 as v;
    let w = T::row_len(d);
    let start = base.wrapping_add(j0 * w) as *const u8;
    let bytes = rows * w * std::mem::size_of::<T>();
    for line in (0..bytes).step_by(64) {
        v::_mm_prefetch::<{ v::_MM_HINT_T0 }>(start.wrapping_add(line) as *const i8);
    }
}

/// What a value pass of a chunk reads: the values, the queries' p_j
/// (`scores`, a row of `span` from key k0 per query), the keys k0..end of
/// the chunk's blocks any query may see, and where the partials go.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct ValuePass<'a, T> {
    values: *const T,
    scores: *const f32,
    span: usize,
    k0: usize,
    end: usize,
    d: usize,
    mask: Option<&'a [u8]>,
    total: usize,
    past: usize,
    q: &'a Queries<'a>,
    at: &'a [*mut f32],
    off: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a, T> ValuePass<'a, T> {
    /// The value pass of task `t`'s chunk from key k0 over its blocks up to
    /// b1, its values from `values` (the task's head's first).
    #[allow(clippy::too_many_arguments)]
    unsafe fn of(
        t: Task<'a, '_>,
        values: *const T,
        q: &'a Queries<'a>,
        scores: *const f32,
        (k0, b1): (usize, usize),
        at: &'a [*mut f32],
        off: usize,
    ) -> ValuePass<'a, T> {
        let cache = &t.seg.cache;
        let d = t.s.head_dim;
        ValuePass {
            values,
            scores,
            span: (b1 - k0 / KB) * KB,
            k0,
            end: b1 * KB,
            d,
            mask: t.mask,
            total: cache.past + t.seg.n,
            past: cache.past,
            q,
            at,
            off,
        }
    }
}

/// One chunk of a task (see `chunk`), written lane-wise so that each path's
/// compilation vectorizes it with the same operations.
#[inline(always)]
unsafe fn chunk_lanes<T: crate::kv::Stored>(
    t: Task<'_, '_>,
    head: Head<T>,
    q: &Queries,
    (k0, k1): (usize, usize),
    at: &[*mut f32],
    off: usize,
    buf: &mut Buffers,
) {
    let s = t.s;
    let d = s.head_dim;
    let cache = &t.seg.cache;
    let mask = t.mask;
    let (past, total) = (cache.past, cache.past + t.seg.n);
    let (keys, values, w) = (head.keys, head.values, T::row_len(d));
    let scale = s.scale;
    let (b0, b1) = chunk_blocks(q, (k0, k1));
    let span = (b1 - b0) * KB;
    let scores = &mut buf.scores[..t.len * span];
    for b in unscored(q, b0, b1) {
        transpose(keys, d, b * KB, total, &mut buf.kt);
        for q0 in (0..t.len).step_by(QB) {
            let qn = QB.min(t.len - q0);
            let mut acc = [[0.0f32; KB]; QB];
            for c in 0..d {
                let col: &[f32; KB] = buf.kt[c * KB..(c + 1) * KB].try_into().expect("a block of 16");
                for qi in 0..qn {
                    let qc = *q.qptr[q0 + qi].add(c);
                    for lane in 0..KB {
                        acc[qi][lane] = qc.mul_add(col[lane], acc[qi][lane]);
                    }
                }
            }
            for qi in 0..qn {
                let at = (q0 + qi) * span + (b - b0) * KB;
                for lane in 0..KB {
                    scores[at + lane] = acc[qi][lane] * scale;
                }
            }
        }
    }
    soft_cap(scores.as_mut_ptr(), scores.len(), s.softcap);
    // softmax within the chunk: p_j in place of the scores, 0 where the query may not see j
    for qi in 0..t.len {
        let (i, _) = q.rows[qi];
        let part = at[qi].add(off);
        let row = &mut scores[qi * span..(qi + 1) * span];
        let seen = |b: usize| seen_lanes(mask, total, past, i, q.run[qi], b);
        let mut best = f32::NEG_INFINITY;
        for b in b0..b1 {
            let bits = seen(b);
            for lane in 0..KB {
                if bits >> lane & 1 == 1 {
                    best = best.max(row[(b - b0) * KB + lane]);
                }
            }
        }
        if best == f32::NEG_INFINITY {
            nothing(part);
            continue;
        }
        let mut lanes = [0.0f32; KB];
        for b in b0..b1 {
            let bits = seen(b);
            for lane in 0..KB {
                let j = (b - b0) * KB + lane;
                let p = if bits >> lane & 1 == 1 { exp(row[j] - best) } else { 0.0 };
                row[j] = p;
                lanes[lane] += p;
            }
        }
        *part = best;
        *part.add(1) = pairwise(lanes);
    }
    // values: 4 queries a pass; keys every one of them sees, then the rest one by one
    for q0 in (0..t.len).step_by(VB) {
        let qn = VB.min(t.len - q0);
        let mut acc = [[0.0f32; DMAX]; VB];
        let (common, last) = value_keys(q, q0, qn, k0, b1 * KB);
        for j in k0..common {
            let v = values.add(j * w);
            for qi in 0..qn {
                let p = scores[(q0 + qi) * span + j - k0];
                let a = &mut acc[qi];
                for c in 0..d {
                    a[c] = p.mul_add(T::get(v, c), a[c]);
                }
            }
        }
        for j in common..last {
            let v = values.add(j * w);
            for qi in 0..qn {
                let (i, _) = q.rows[q0 + qi];
                if j >= q.limit[q0 + qi] || !allowed(mask, total, past, i, j) {
                    continue; // a key the query may not see adds nothing
                }
                let p = scores[(q0 + qi) * span + j - k0];
                let a = &mut acc[qi];
                for c in 0..d {
                    a[c] = p.mul_add(T::get(v, c), a[c]);
                }
            }
        }
        for qi in 0..qn {
            let part = at[q0 + qi].add(off);
            if *part != f32::NEG_INFINITY {
                std::slice::from_raw_parts_mut(part.add(2), d).copy_from_slice(&acc[qi][..d]);
            }
        }
    }
}

/// The same task with explicit AVX-512 (head sizes a multiple of 16): each
/// step the lane-wise code's operations, in its order.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64 as v;

    /// `rowwise::exp` on 16 lanes: the same operations.
    #[inline(always)]
    unsafe fn exp16(x: v::__m512) -> v::__m512 {
        let magic = v::_mm512_set1_ps(12_582_912.0);
        let t = v::_mm512_fmadd_ps(x, v::_mm512_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = v::_mm512_sub_ps(t, magic);
        let neg = v::_mm512_sub_ps(v::_mm512_setzero_ps(), n);
        let r = v::_mm512_fmadd_ps(neg, v::_mm512_set1_ps(0.693_359_4), x);
        let r = v::_mm512_fmadd_ps(neg, v::_mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = v::_mm512_set1_ps(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
            p = v::_mm512_fmadd_ps(p, r, v::_mm512_set1_ps(c));
        }
        let p = v::_mm512_add_ps(v::_mm512_fmadd_ps(v::_mm512_mul_ps(p, r), r, r), v::_mm512_set1_ps(1.0));
        let bits = v::_mm512_slli_epi32::<23>(v::_mm512_add_epi32(v::_mm512_cvtps_epi32(n), v::_mm512_set1_epi32(127)));
        let y = v::_mm512_mul_ps(p, v::_mm512_castsi512_ps(bits));
        // below −87.3: 0; above 88: +∞ (as rowwise::exp)
        let low = v::_mm512_cmp_ps_mask::<{ v::_CMP_LT_OQ }>(x, v::_mm512_set1_ps(-87.3));
        let high = v::_mm512_cmp_ps_mask::<{ v::_CMP_GT_OQ }>(x, v::_mm512_set1_ps(88.0));
        let y = v::_mm512_mask_mov_ps(y, low, v::_mm512_setzero_ps());
        v::_mm512_mask_mov_ps(y, high, v::_mm512_set1_ps(f32::INFINITY))
    }

    /// Keys j0..j0 + 16 transposed into `kt` (d × 16), by 16 × 16 tiles of
    /// shuffles (d a multiple of 16; a partial block: `super::transpose`).
    #[inline(always)]
    pub(super) unsafe fn transpose16<T: Lanes>(keys: *const T, d: usize, j0: usize, total: usize, kt: &mut [f32]) {
        if total - j0 < KB {
            return super::transpose(keys, d, j0, total, kt);
        }
        for c0 in (0..d).step_by(KB) {
            let mut r = [v::_mm512_setzero_ps(); KB];
            for lane in 0..KB {
                r[lane] = T::load16(keys.add((j0 + lane) * T::row_len(d)), c0);
            }
            let c = transpose_16x16(r);
            for cc in 0..KB {
                v::_mm512_storeu_ps(kt.as_mut_ptr().add((c0 + cc) * KB), c[cc]);
            }
        }
    }

    /// 16 rows of 16 lanes transposed by shuffles: t[c] lane l = lane c of r[l].
    #[inline(always)]
    pub(super) unsafe fn transpose_16x16(r: [v::__m512; KB]) -> [v::__m512; KB] {
        // pairs of rows interleaved by 32, then 64 bits, then 128-bit quarters twice
        let mut a = [v::_mm512_setzero_ps(); KB];
        for k in 0..8 {
            a[2 * k] = v::_mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
            a[2 * k + 1] = v::_mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
        }
        let mut b = [v::_mm512_setzero_ps(); KB];
        for k in 0..4 {
            for h in 0..2 {
                let (x, y) = (v::_mm512_castps_pd(a[4 * k + h]), v::_mm512_castps_pd(a[4 * k + 2 + h]));
                b[4 * k + 2 * h] = v::_mm512_castpd_ps(v::_mm512_unpacklo_pd(x, y));
                b[4 * k + 2 * h + 1] = v::_mm512_castpd_ps(v::_mm512_unpackhi_pd(x, y));
            }
        }
        // b[4k + m] holds, in 128-bit quarter q, rows 4k..4k+4 of column 4q + m
        let mut c = [v::_mm512_setzero_ps(); KB];
        for m in 0..4 {
            let (p0, p1, p2, p3) = (b[m], b[4 + m], b[8 + m], b[12 + m]);
            let lo01 = v::_mm512_shuffle_f32x4::<0x44>(p0, p1); // quarters 0,1 of p0, 0,1 of p1
            let hi01 = v::_mm512_shuffle_f32x4::<0xee>(p0, p1); // quarters 2,3 of p0, 2,3 of p1
            let lo23 = v::_mm512_shuffle_f32x4::<0x44>(p2, p3);
            let hi23 = v::_mm512_shuffle_f32x4::<0xee>(p2, p3);
            c[m] = v::_mm512_shuffle_f32x4::<0x88>(lo01, lo23); // column m: quarter 0 of each
            c[4 + m] = v::_mm512_shuffle_f32x4::<0xdd>(lo01, lo23); // column 4 + m
            c[8 + m] = v::_mm512_shuffle_f32x4::<0x88>(hi01, hi23);
            c[12 + m] = v::_mm512_shuffle_f32x4::<0xdd>(hi01, hi23);
        }
        c
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn chunk_avx512<T: Lanes>(
        t: Task<'_, '_>,
        head: Head<T>,
        q: &Queries,
        (k0, k1): (usize, usize),
        at: &[*mut f32],
        off: usize,
        buf: &mut Buffers,
    ) {
        let s = t.s;
        let d = s.head_dim;
        let cache = &t.seg.cache;
        let mask = t.mask;
        let (past, total) = (cache.past, cache.past + t.seg.n);
        let keys = head.keys;
        let scale = v::_mm512_set1_ps(s.scale);
        let Queries { rows, qptr, .. } = q;
        let (b0, b1) = chunk_blocks(q, (k0, k1));
        let span = (b1 - b0) * KB;
        let scores = buf.scores.as_mut_ptr();
        // query groups of at most QB (sizes balanced); a group of fewer than QB
        // takes two key blocks a step, so that its sums (queries × blocks) cover
        // the FMA latency (each score still one chain over d in order)
        let groups = t.len.div_ceil(QB);
        let step = if t.len / groups < QB { KT_BLOCKS } else { 1 };
        let mut b = unscored(q, b0, b1).start;
        while b < b1 {
            let nb = step.min(b1 - b);
            for k in 0..nb {
                fetch_rows(keys, d, (b + k + AHEAD.max(nb)) * KB, KB);
                transpose16(keys, d, (b + k) * KB, total, &mut buf.kt[k * d * KB..]);
            }
            let row = scores.add((b - b0) * KB);
            let mut q0 = 0;
            for g in 0..groups {
                let qn = t.len / groups + usize::from(g < t.len % groups);
                let (qs, at) = (&qptr[q0..q0 + qn], row.add(q0 * span));
                match qn {
                    1 => scores_step::<1>(nb, &buf.kt, qs, d, scale, at, span),
                    2 => scores_step::<2>(nb, &buf.kt, qs, d, scale, at, span),
                    3 => scores_step::<3>(nb, &buf.kt, qs, d, scale, at, span),
                    4 => scores_step::<4>(nb, &buf.kt, qs, d, scale, at, span),
                    5 => scores_step::<5>(nb, &buf.kt, qs, d, scale, at, span),
                    6 => scores_step::<6>(nb, &buf.kt, qs, d, scale, at, span),
                    7 => scores_step::<7>(nb, &buf.kt, qs, d, scale, at, span),
                    _ => scores_step::<QB>(nb, &buf.kt, qs, d, scale, at, span),
                }
                q0 += qn;
            }
            b += nb;
        }
        soft_cap(scores, t.len * span, s.softcap);
        // softmax within the chunk: p_j in place of the scores (0 where the query may not see j)
        for qi in 0..t.len {
            let (i, _) = rows[qi];
            let part = at[qi].add(off);
            let row = scores.add(qi * span);
            let seen = |b: usize| seen_lanes(mask, total, past, i, q.run[qi], b);
            let mut best = v::_mm512_set1_ps(f32::NEG_INFINITY);
            for b in b0..b1 {
                best = v::_mm512_mask_max_ps(best, seen(b), v::_mm512_loadu_ps(row.add((b - b0) * KB)), best);
            }
            let top = v::_mm512_reduce_max_ps(best);
            if top == f32::NEG_INFINITY {
                nothing(part);
                continue;
            }
            let topv = v::_mm512_set1_ps(top);
            let mut lanes = v::_mm512_setzero_ps();
            for b in b0..b1 {
                let x = v::_mm512_sub_ps(v::_mm512_loadu_ps(row.add((b - b0) * KB)), topv);
                let p = v::_mm512_maskz_mov_ps(seen(b), exp16(x));
                v::_mm512_storeu_ps(row.add((b - b0) * KB), p);
                lanes = v::_mm512_add_ps(lanes, p);
            }
            let mut l = [0.0f32; KB];
            v::_mm512_storeu_ps(l.as_mut_ptr(), lanes);
            *part = top;
            *part.add(1) = pairwise(l);
        }
        // values: a few queries a pass; keys every one of them sees, then the rest one by one
        let vp = ValuePass::of(t, head.values, q, scores, (k0, b1), at, off);
        let mut q0 = 0;
        while q0 < t.len {
            let left = t.len - q0;
            q0 += match d / KB {
                4 => match left {
                    1 => values_fixed::<T, 4, 1>(&vp, q0),
                    2 => values_fixed::<T, 4, 2>(&vp, q0),
                    3 => values_fixed::<T, 4, 3>(&vp, q0),
                    4 => values_fixed::<T, 4, 4>(&vp, q0),
                    5 => values_fixed::<T, 4, 5>(&vp, q0),
                    // 24 sums in registers: a row's conversion shared by 6 queries
                    _ => values_fixed::<T, 4, 6>(&vp, q0),
                },
                8 => match left {
                    1 => values_fixed::<T, 8, 1>(&vp, q0),
                    2 => values_fixed::<T, 8, 2>(&vp, q0),
                    _ => values_fixed::<T, 8, 3>(&vp, q0),
                },
                _ => values_any(&vp, q0, VB.min(left)),
            };
        }
    }

    /// `scores_blocks` over `nb` (1 or 2) key blocks.
    #[inline(always)]
    unsafe fn scores_step<const Q: usize>(
        nb: usize,
        kt: &[f32],
        qs: &[*const f32],
        d: usize,
        scale: v::__m512,
        at: *mut f32,
        span: usize,
    ) {
        match nb {
            1 => scores_blocks::<Q, 1>(kt, qs, d, scale, at, span),
            _ => scores_blocks::<Q, 2>(kt, qs, d, scale, at, span),
        }
    }

    /// The scores of Q queries (`qs`, their vectors) against B transposed
    /// key blocks `kt` (B × d × 16), times `scale`, at `at` (a row of
    /// `span` a query, block k's 16 at k·16); the Q·B sums held in
    /// registers, each the fused multiply-adds over the dimensions in order.
    #[inline(always)]
    unsafe fn scores_blocks<const Q: usize, const B: usize>(
        kt: &[f32],
        qs: &[*const f32],
        d: usize,
        scale: v::__m512,
        at: *mut f32,
        span: usize,
    ) {
        let q: [*const f32; Q] = std::array::from_fn(|qi| qs[qi]);
        let kt = kt.as_ptr();
        let mut acc = [[v::_mm512_setzero_ps(); B]; Q];
        for c in 0..d {
            let col: [v::__m512; B] = std::array::from_fn(|k| v::_mm512_loadu_ps(kt.add(k * d * KB + c * KB)));
            for qi in 0..Q {
                let x = v::_mm512_set1_ps(*q[qi].add(c));
                for k in 0..B {
                    acc[qi][k] = v::_mm512_fmadd_ps(x, col[k], acc[qi][k]);
                }
            }
        }
        for qi in 0..Q {
            for k in 0..B {
                v::_mm512_storeu_ps(at.add(qi * span + k * KB), v::_mm512_mul_ps(acc[qi][k], scale));
            }
        }
    }

    /// Queries q0..q0 + Q of a value pass (head size 16·C), their sums held
    /// in registers; returns Q.
    #[inline(always)]
    unsafe fn values_fixed<T: Lanes, const C: usize, const Q: usize>(vp: &ValuePass<'_, T>, q0: usize) -> usize {
        let limit = &vp.q.limit[q0..q0 + Q];
        let (common, last) = value_keys(vp.q, q0, limit.len(), vp.k0, vp.end);
        let score = |qi: usize, j: usize| *vp.scores.add((q0 + qi) * vp.span + j - vp.k0);
        let mut acc = [[v::_mm512_setzero_ps(); C]; Q];
        for j in vp.k0..common {
            let vj = vp.values.add(j * T::row_len(vp.d));
            fetch_rows(vp.values, vp.d, j + AHEAD * KB, 1);
            let mut p = [v::_mm512_setzero_ps(); Q];
            for qi in 0..Q {
                p[qi] = v::_mm512_set1_ps(score(qi, j));
            }
            for c in 0..C {
                let vv = T::load16(vj, c * KB);
                for qi in 0..Q {
                    acc[qi][c] = v::_mm512_fmadd_ps(p[qi], vv, acc[qi][c]);
                }
            }
        }
        for j in common..last {
            let vj = vp.values.add(j * T::row_len(vp.d));
            for qi in 0..Q {
                let (i, _) = vp.q.rows[q0 + qi];
                if j >= limit[qi] || !allowed(vp.mask, vp.total, vp.past, i, j) {
                    continue; // a key the query may not see adds nothing
                }
                let p = v::_mm512_set1_ps(score(qi, j));
                for c in 0..C {
                    acc[qi][c] = v::_mm512_fmadd_ps(p, T::load16(vj, c * KB), acc[qi][c]);
                }
            }
        }
        for qi in 0..Q {
            let part = vp.at[q0 + qi].add(vp.off);
            if *part != f32::NEG_INFINITY {
                for c in 0..C {
                    v::_mm512_storeu_ps(part.add(2 + c * KB), acc[qi][c]);
                }
            }
        }
        Q
    }

    /// Queries q0..q0 + qn (at most `VB`) of a value pass, any head size
    /// (a multiple of 16); returns qn.
    #[inline(always)]
    unsafe fn values_any<T: Lanes>(vp: &ValuePass<'_, T>, q0: usize, qn: usize) -> usize {
        let chunks = vp.d / KB;
        let limit = &vp.q.limit[q0..q0 + qn];
        let (common, last) = value_keys(vp.q, q0, limit.len(), vp.k0, vp.end);
        let score = |qi: usize, j: usize| *vp.scores.add((q0 + qi) * vp.span + j - vp.k0);
        let mut acc = [[v::_mm512_setzero_ps(); DMAX / KB]; VB];
        for j in vp.k0..common {
            let vj = vp.values.add(j * T::row_len(vp.d));
            fetch_rows(vp.values, vp.d, j + AHEAD * KB, 1);
            for c in 0..chunks {
                let vv = T::load16(vj, c * KB);
                for qi in 0..qn {
                    acc[qi][c] = v::_mm512_fmadd_ps(v::_mm512_set1_ps(score(qi, j)), vv, acc[qi][c]);
                }
            }
        }
        for j in common..last {
            let vj = vp.values.add(j * T::row_len(vp.d));
            for qi in 0..qn {
                let (i, _) = vp.q.rows[q0 + qi];
                if j >= limit[qi] || !allowed(vp.mask, vp.total, vp.past, i, j) {
                    continue; // a key the query may not see adds nothing
                }
                let p = v::_mm512_set1_ps(score(qi, j));
                for c in 0..chunks {
                    acc[qi][c] = v::_mm512_fmadd_ps(p, T::load16(vj, c * KB), acc[qi][c]);
                }
            }
        }
        for qi in 0..qn {
            let part = vp.at[q0 + qi].add(vp.off);
            if *part != f32::NEG_INFINITY {
                for c in 0..chunks {
                    v::_mm512_storeu_ps(part.add(2 + c * KB), acc[qi][c]);
                }
            }
        }
        qn
    }
}

/// The same task with explicit AVX2 (head sizes a multiple of 8): a block
/// of 16 keys as two vectors of 8 lanes, each step the lane-wise code's
/// operations in its order (the 16 lanes of the softmax sum kept as two
/// halves, added pairwise as 16 lanes).
#[cfg(target_arch = "x86_64")]
mod x86_avx2 {
    use super::*;
    use std::arch::x86_64 as v;

    const H: usize = 8;

    /// `rowwise::exp` on 8 lanes: the same operations.
    #[inline(always)]
    unsafe fn exp8(x: v::__m256) -> v::__m256 {
        let magic = v::_mm256_set1_ps(12_582_912.0);
        let t = v::_mm256_fmadd_ps(x, v::_mm256_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = v::_mm256_sub_ps(t, magic);
        let neg = v::_mm256_sub_ps(v::_mm256_setzero_ps(), n);
        let r = v::_mm256_fmadd_ps(neg, v::_mm256_set1_ps(0.693_359_4), x);
        let r = v::_mm256_fmadd_ps(neg, v::_mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = v::_mm256_set1_ps(1.987_569_1e-4);
        for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5] {
            p = v::_mm256_fmadd_ps(p, r, v::_mm256_set1_ps(c));
        }
        let p = v::_mm256_add_ps(v::_mm256_fmadd_ps(v::_mm256_mul_ps(p, r), r, r), v::_mm256_set1_ps(1.0));
        let bits = v::_mm256_slli_epi32::<23>(v::_mm256_add_epi32(v::_mm256_cvtps_epi32(n), v::_mm256_set1_epi32(127)));
        let y = v::_mm256_mul_ps(p, v::_mm256_castsi256_ps(bits));
        // below −87.3: 0; above 88: +∞ (as rowwise::exp)
        let low = v::_mm256_cmp_ps::<{ v::_CMP_LT_OQ }>(x, v::_mm256_set1_ps(-87.3));
        let high = v::_mm256_cmp_ps::<{ v::_CMP_GT_OQ }>(x, v::_mm256_set1_ps(88.0));
        let y = v::_mm256_andnot_ps(low, y);
        v::_mm256_blendv_ps(y, v::_mm256_set1_ps(f32::INFINITY), high)
    }

    /// Lanes 8h..8h + 8 of a 16-bit mask as an all-ones / zeros vector.
    #[inline(always)]
    unsafe fn lanes(bits: u16, h: usize) -> v::__m256 {
        let b = v::_mm256_set1_epi32(((bits >> (H * h)) & 0xff) as i32);
        let one = v::_mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        v::_mm256_castsi256_ps(v::_mm256_cmpeq_epi32(v::_mm256_and_si256(b, one), one))
    }

    /// Keys j0..j0 + 16 transposed into `kt` (d × 16) by 8 × 8 shuffles (d a
    /// multiple of 8; a partial block: `super::transpose`).
    #[inline(always)]
    pub(super) unsafe fn transpose16<T: Lanes>(keys: *const T, d: usize, j0: usize, total: usize, kt: &mut [f32]) {
        if total - j0 < KB {
            return super::transpose(keys, d, j0, total, kt);
        }
        for h in 0..2 {
            for c0 in (0..d).step_by(H) {
                let mut r = [v::_mm256_setzero_ps(); H];
                for lane in 0..H {
                    r[lane] = T::load8(keys.add((j0 + H * h + lane) * T::row_len(d)), c0);
                }
                let c = transpose_8x8(r);
                for cc in 0..H {
                    v::_mm256_storeu_ps(kt.as_mut_ptr().add((c0 + cc) * KB + H * h), c[cc]);
                }
            }
        }
    }

    /// 8 rows of 8 lanes transposed by shuffles: t[c] lane l = lane c of r[l].
    #[inline(always)]
    pub(super) unsafe fn transpose_8x8(r: [v::__m256; H]) -> [v::__m256; H] {
        let mut a = [v::_mm256_setzero_ps(); H];
        for k in 0..4 {
            a[2 * k] = v::_mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
            a[2 * k + 1] = v::_mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
        }
        let mut b = [v::_mm256_setzero_ps(); H];
        for k in 0..2 {
            b[4 * k] = v::_mm256_shuffle_ps::<0x44>(a[4 * k], a[4 * k + 2]);
            b[4 * k + 1] = v::_mm256_shuffle_ps::<0xee>(a[4 * k], a[4 * k + 2]);
            b[4 * k + 2] = v::_mm256_shuffle_ps::<0x44>(a[4 * k + 1], a[4 * k + 3]);
            b[4 * k + 3] = v::_mm256_shuffle_ps::<0xee>(a[4 * k + 1], a[4 * k + 3]);
        }
        // b[m] (rows 0..4) and b[4 + m] (rows 4..8) hold columns m and 4 + m in their halves
        let mut t = [v::_mm256_setzero_ps(); H];
        for m in 0..4 {
            t[m] = v::_mm256_permute2f128_ps::<0x20>(b[m], b[4 + m]);
            t[4 + m] = v::_mm256_permute2f128_ps::<0x31>(b[m], b[4 + m]);
        }
        t
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn chunk_avx2<T: Lanes>(
        t: Task<'_, '_>,
        head: Head<T>,
        q: &Queries,
        (k0, k1): (usize, usize),
        at: &[*mut f32],
        off: usize,
        buf: &mut Buffers,
    ) {
        let s = t.s;
        let d = s.head_dim;
        let cache = &t.seg.cache;
        let mask = t.mask;
        let (past, total) = (cache.past, cache.past + t.seg.n);
        let keys = head.keys;
        let scale = v::_mm256_set1_ps(s.scale);
        let Queries { rows, qptr, .. } = q;
        let (b0, b1) = chunk_blocks(q, (k0, k1));
        let span = (b1 - b0) * KB;
        let scores = buf.scores.as_mut_ptr();
        for b in unscored(q, b0, b1) {
            fetch_rows(keys, d, (b + AHEAD) * KB, KB);
            transpose16(keys, d, b * KB, total, &mut buf.kt);
            let row = scores.add((b - b0) * KB);
            for q0 in (0..t.len).step_by(4) {
                let qs = &qptr[q0..q0 + 4.min(t.len - q0)];
                let at = row.add(q0 * span);
                match qs.len() {
                    1 => scores_fixed::<1>(&buf.kt, qs, d, scale, at, span),
                    2 => scores_fixed::<2>(&buf.kt, qs, d, scale, at, span),
                    3 => scores_fixed::<3>(&buf.kt, qs, d, scale, at, span),
                    _ => scores_fixed::<4>(&buf.kt, qs, d, scale, at, span),
                }
            }
        }
        soft_cap(scores, t.len * span, s.softcap);
        // softmax within the chunk: p_j in place of the scores (0 where the query may not see j)
        for qi in 0..t.len {
            let (i, _) = rows[qi];
            let part = at[qi].add(off);
            let row = scores.add(qi * span);
            let seen = |b: usize| seen_lanes(mask, total, past, i, q.run[qi], b);
            let ninf = v::_mm256_set1_ps(f32::NEG_INFINITY);
            let mut best = ninf;
            for b in b0..b1 {
                let bits = seen(b);
                for h in 0..2 {
                    let x = v::_mm256_loadu_ps(row.add((b - b0) * KB + H * h));
                    best = v::_mm256_max_ps(best, v::_mm256_blendv_ps(ninf, x, lanes(bits, h)));
                }
            }
            let mut m = [0.0f32; H];
            v::_mm256_storeu_ps(m.as_mut_ptr(), best);
            let top = m.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if top == f32::NEG_INFINITY {
                nothing(part);
                continue;
            }
            let topv = v::_mm256_set1_ps(top);
            let mut sum = [v::_mm256_setzero_ps(); 2];
            for b in b0..b1 {
                let bits = seen(b);
                for h in 0..2 {
                    let at = row.add((b - b0) * KB + H * h);
                    let x = v::_mm256_sub_ps(v::_mm256_loadu_ps(at), topv);
                    let p = v::_mm256_and_ps(exp8(x), lanes(bits, h));
                    v::_mm256_storeu_ps(at, p);
                    sum[h] = v::_mm256_add_ps(sum[h], p);
                }
            }
            let mut l = [0.0f32; KB];
            v::_mm256_storeu_ps(l.as_mut_ptr(), sum[0]);
            v::_mm256_storeu_ps(l.as_mut_ptr().add(H), sum[1]);
            *part = top;
            *part.add(1) = pairwise(l);
        }
        // values: a few queries a pass; keys every one of them sees, then the rest one by one
        let vp = ValuePass::of(t, head.values, q, scores, (k0, b1), at, off);
        let mut q0 = 0;
        while q0 < t.len {
            let left = t.len - q0;
            q0 += match d / H {
                // a head of 64 in two halves of 32 dimensions, 3 queries a pass: 12 sums in registers
                8 => {
                    let take = left.min(3);
                    for half in [0, 4] {
                        match take {
                            1 => values_fixed::<T, 4, 1>(&vp, q0, half),
                            2 => values_fixed::<T, 4, 2>(&vp, q0, half),
                            _ => values_fixed::<T, 4, 3>(&vp, q0, half),
                        }
                    }
                    take
                }
                _ => values_any(&vp, q0, VB.min(left)),
            };
        }
    }

    /// The scores of Q queries (`qs`, their vectors) against a transposed
    /// key block `kt` (d × 16), times `scale`, at `at` (a row of `span` a
    /// query); the sums held in registers.
    #[inline(always)]
    unsafe fn scores_fixed<const Q: usize>(
        kt: &[f32],
        qs: &[*const f32],
        d: usize,
        scale: v::__m256,
        at: *mut f32,
        span: usize,
    ) {
        let q: [*const f32; Q] = std::array::from_fn(|qi| qs[qi]);
        let mut acc = [[v::_mm256_setzero_ps(); 2]; Q];
        for c in 0..d {
            let lo = v::_mm256_loadu_ps(kt.as_ptr().add(c * KB));
            let hi = v::_mm256_loadu_ps(kt.as_ptr().add(c * KB + H));
            for qi in 0..Q {
                let qc = v::_mm256_set1_ps(*q[qi].add(c));
                acc[qi][0] = v::_mm256_fmadd_ps(qc, lo, acc[qi][0]);
                acc[qi][1] = v::_mm256_fmadd_ps(qc, hi, acc[qi][1]);
            }
        }
        for qi in 0..Q {
            v::_mm256_storeu_ps(at.add(qi * span), v::_mm256_mul_ps(acc[qi][0], scale));
            v::_mm256_storeu_ps(at.add(qi * span + H), v::_mm256_mul_ps(acc[qi][1], scale));
        }
    }

    /// Queries q0..q0 + Q of a value pass, dimensions 8·c0..8·(c0 + C) of
    /// their heads, the sums held in registers.
    #[inline(always)]
    unsafe fn values_fixed<T: Lanes, const C: usize, const Q: usize>(vp: &ValuePass<'_, T>, q0: usize, c0: usize) {
        let limit = &vp.q.limit[q0..q0 + Q];
        let (common, last) = value_keys(vp.q, q0, limit.len(), vp.k0, vp.end);
        let score = |qi: usize, j: usize| *vp.scores.add((q0 + qi) * vp.span + j - vp.k0);
        let mut acc = [[v::_mm256_setzero_ps(); C]; Q];
        for j in vp.k0..common {
            let vj = vp.values.add(j * T::row_len(vp.d));
            if c0 == 0 {
                fetch_rows(vp.values, vp.d, j + AHEAD * KB, 1);
            }
            let mut p = [v::_mm256_setzero_ps(); Q];
            for qi in 0..Q {
                p[qi] = v::_mm256_set1_ps(score(qi, j));
            }
            for c in 0..C {
                let vv = T::load8(vj, (c0 + c) * H);
                for qi in 0..Q {
                    acc[qi][c] = v::_mm256_fmadd_ps(p[qi], vv, acc[qi][c]);
                }
            }
        }
        for j in common..last {
            let vj = vp.values.add(j * T::row_len(vp.d));
            for qi in 0..Q {
                let (i, _) = vp.q.rows[q0 + qi];
                if j >= limit[qi] || !allowed(vp.mask, vp.total, vp.past, i, j) {
                    continue; // a key the query may not see adds nothing
                }
                let p = v::_mm256_set1_ps(score(qi, j));
                for c in 0..C {
                    acc[qi][c] = v::_mm256_fmadd_ps(p, T::load8(vj, (c0 + c) * H), acc[qi][c]);
                }
            }
        }
        for qi in 0..Q {
            let part = vp.at[q0 + qi].add(vp.off);
            if *part != f32::NEG_INFINITY {
                for c in 0..C {
                    v::_mm256_storeu_ps(part.add(2 + (c0 + c) * H), acc[qi][c]);
                }
            }
        }
    }

    /// Queries q0..q0 + qn (at most `VB`) of a value pass, any head size
    /// (a multiple of 8); returns qn.
    #[inline(always)]
    unsafe fn values_any<T: Lanes>(vp: &ValuePass<'_, T>, q0: usize, qn: usize) -> usize {
        let chunks = vp.d / H;
        let limit = &vp.q.limit[q0..q0 + qn];
        let (common, last) = value_keys(vp.q, q0, limit.len(), vp.k0, vp.end);
        let score = |qi: usize, j: usize| *vp.scores.add((q0 + qi) * vp.span + j - vp.k0);
        let mut acc = [[v::_mm256_setzero_ps(); DMAX / H]; VB];
        for j in vp.k0..common {
            let vj = vp.values.add(j * T::row_len(vp.d));
            fetch_rows(vp.values, vp.d, j + AHEAD * KB, 1);
            for c in 0..chunks {
                let vv = T::load8(vj, c * H);
                for qi in 0..qn {
                    acc[qi][c] = v::_mm256_fmadd_ps(v::_mm256_set1_ps(score(qi, j)), vv, acc[qi][c]);
                }
            }
        }
        for j in common..last {
            let vj = vp.values.add(j * T::row_len(vp.d));
            for qi in 0..qn {
                let (i, _) = vp.q.rows[q0 + qi];
                if j >= limit[qi] || !allowed(vp.mask, vp.total, vp.past, i, j) {
                    continue; // a key the query may not see adds nothing
                }
                let p = v::_mm256_set1_ps(score(qi, j));
                for c in 0..chunks {
                    acc[qi][c] = v::_mm256_fmadd_ps(p, T::load8(vj, c * H), acc[qi][c]);
                }
            }
        }
        for qi in 0..qn {
            let part = vp.at[q0 + qi].add(vp.off);
            if *part != f32::NEG_INFINITY {
                for c in 0..chunks {
                    v::_mm256_storeu_ps(part.add(2 + c * H), acc[qi][c]);
                }
            }
        }
        qn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::Cache;
    use crate::quant::path_available;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(97))
                    >> 8;
                (h % 2001) as f32 / 500.0 - 2.0
            })
            .collect()
    }

    /// Every path, every thread count, a query alone or among others and
    /// under a tree's mask (its root row the chain's): the same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_shuffle_transposes_move_every_key() {
        let (d, total) = (48, 37);
        let keys = values(total * d, 9);
        for j0 in [0, 16, 32] {
            let mut a = vec![f32::NAN; d * KB];
            unsafe { transpose(keys.as_ptr(), d, j0, total, &mut a) };
            let want: Vec<u32> = a.iter().map(|x| x.to_bits()).collect();
            if path_available(Path::Avx512) {
                let mut b = vec![f32::NAN; d * KB];
                unsafe { x86_transpose(&keys, d, j0, total, &mut b) };
                assert_eq!(b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            }
            if path_available(Path::Avx2) {
                let mut b = vec![f32::NAN; d * KB];
                unsafe { avx2_transpose(&keys, d, j0, total, &mut b) };
                assert_eq!(b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_transpose(keys: &[f32], d: usize, j0: usize, total: usize, kt: &mut [f32]) {
        super::x86_avx2::transpose16(keys.as_ptr(), d, j0, total, kt)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn x86_transpose(keys: &[f32], d: usize, j0: usize, total: usize, kt: &mut [f32]) {
        super::x86::transpose16(keys.as_ptr(), d, j0, total, kt)
    }

    #[test]
    fn a_query_has_the_same_bits_on_every_path_alone_or_in_a_batch() {
        for head_dim in [40, 64, 128] {
            same_bits(head_dim, 37, 64);
        }
    }

    /// Past 256 keys a query's chunks are combined: still the same bits on
    /// every path and thread count (the threads then share a head's chunks),
    /// alone or in a batch, and the softmax of all its keys.
    #[test]
    fn chunks_of_a_long_context_combine_to_the_same_bits_everywhere() {
        for head_dim in [40, 64] {
            same_bits(head_dim, 2 * CHUNK + 90, 3 * CHUNK);
        }
        // a chunk boundary inside the block: the last row's keys start a new chunk
        same_bits(64, CHUNK - 4, CHUNK + 16);
    }

    /// Every count of a head's queries (1 to 40: groups of 1, 2, 3 and 8
    /// heads, 1 to 5 rows) over contexts whose key blocks end a step of the
    /// scores anywhere, head sizes 32 and 64 (a value pass of 64 takes 1 to
    /// 6 queries): the bits of the portable code on every path, thread
    /// count and batch (the scores take 1 or 2 blocks at a time).
    #[test]
    fn every_count_of_queries_and_blocks_has_the_same_bits() {
        for ((heads, kv_heads), d) in [(2, 2), (4, 2), (6, 2), (8, 1)]
            .into_iter()
            .flat_map(|h| [(h, 32), (h, 64)])
        {
            let s = Shape::llama(0, heads, kv_heads, d, 0, 0.0);
            let width = (heads + 2 * kv_heads) * d;
            for (past, n) in [(0, 1), (20, 2), (47, 3), (63, 1), (100, 3), (90, 5), (CHUNK + 30, 2)] {
                let capacity = past + n + 16;
                let qkv = values(n * width, 5);
                let cache = F32Cache {
                    keys: &values(kv_heads * capacity * d, 6),
                    values: &values(kv_heads * capacity * d, 7),
                    capacity,
                    past,
                };
                let want = cache.attention_bits(&qkv, s, 0..n, None, Path::Portable, 1);
                for path in Path::all().into_iter().filter(|p| path_available(*p)) {
                    for threads in [1, 2] {
                        let got = cache.attention_bits(&qkv, s, 0..n, None, path, threads);
                        assert_eq!(
                            got, want,
                            "{heads}/{kv_heads} heads, past {past}, n {n}, {path:?}, {threads}"
                        );
                    }
                    for i in 0..n {
                        let one = F32Cache {
                            past: past + i,
                            ..cache
                        };
                        let got = one.attention_bits(&qkv[i * width..], s, 0..1, None, path, 1);
                        let row = heads * d;
                        assert_eq!(got, want[i * row..(i + 1) * row], "row {i} {path:?}");
                    }
                }
            }
        }
    }

    /// Gemma 2's scores (another scale, soft-capped): the capped softmax
    /// (float64 reference), the same bits on every path, thread count and
    /// batch, within a chunk and across chunks.
    #[test]
    fn soft_capped_scores_have_the_same_bits_everywhere() {
        let s = Shape {
            scale: 0.3,
            softcap: 2.0,
            ..Shape::llama(0, 4, 2, 64, 0, 0.0)
        };
        let (d, n) = (s.head_dim, 3);
        let width = (s.heads + 2 * s.kv_heads) * d;
        for (past, capacity) in [(37, 64), (2 * CHUNK + 90, 3 * CHUNK)] {
            let qkv: Vec<f32> = values(n * width, 4).iter().map(|v| v * 2.0).collect();
            let (keys, vals) = (
                values(s.kv_heads * capacity * d, 5),
                values(s.kv_heads * capacity * d, 6),
            );
            let run_as = |s: Shape, rows: std::ops::Range<usize>, path: Path, threads: usize| {
                let cache = F32Cache {
                    keys: &keys,
                    values: &vals,
                    capacity,
                    past,
                };
                cache.attention_bits(&qkv, s, rows, None, path, threads)
            };
            let run = |rows: std::ops::Range<usize>, path: Path, threads: usize| run_as(s, rows, path, threads);
            let all = run(0..n, Path::Portable, 1);
            let uncapped = run_as(Shape { softcap: 0.0, ..s }, 0..n, Path::Portable, 1);
            let mut moved = 0.0f64;
            for i in 0..n {
                let seen: Vec<usize> = (0..=past + i).collect();
                for head in 0..s.heads {
                    let want = reference(&qkv, &keys, &vals, s, capacity, i, head, &seen);
                    for c in 0..d {
                        let at = (i * s.heads + head) * d + c;
                        let got = f32::from_bits(all[at]) as f64;
                        assert!((got - want[c]).abs() < 1e-4, "past {past} row {i} head {head} lane {c}");
                        moved = moved.max((got - f32::from_bits(uncapped[at]) as f64).abs());
                    }
                }
            }
            assert!(moved > 1e-3, "the cap changes the output ({moved})");
            for path in Path::all().into_iter().filter(|p| path_available(*p)) {
                for threads in [1, 2, 3] {
                    assert_eq!(run(0..n, path, threads), all, "{path:?} {threads}");
                }
                for i in 0..n {
                    assert_eq!(
                        run(i..i + 1, path, 1),
                        all[i * s.heads * d..(i + 1) * s.heads * d],
                        "row {i}"
                    );
                }
            }
        }
    }

    /// A binary16 or q8_0 cache is read as the float32 values it holds:
    /// its attention has the bits of a float32 cache holding those values,
    /// on every path and thread count, split or not, causal, windowed or
    /// under a tree's mask (so every float32 test above holds for it).
    #[test]
    fn a_half_or_q8_cache_reads_as_its_float32_values() {
        use crate::kv::Stored;
        use half::f16;
        for (head_dim, past, capacity) in [
            (64, 37, 64),
            (40, 2 * CHUNK + 90, 3 * CHUNK),
            (128, CHUNK - 4, CHUNK + 16),
            (64, 2 * CHUNK + 90, 3 * CHUNK),
        ] {
            let s = Shape::llama(0, 6, 2, head_dim, 0, 0.0);
            let (d, n, rows) = (head_dim, 5, s.kv_heads * capacity);
            let width = (s.heads + 2 * s.kv_heads) * d;
            let qkv = values(n * width, 4);
            let (k0, v0) = (values(rows * d, 5), values(rows * d, 6));
            let scaled = |x: &[f32]| -> Vec<f32> { x.iter().map(|v| v * 3.7).collect() };
            let (k0, v0) = (scaled(&k0), scaled(&v0));
            // each stored type written row by row, as a layer writes it
            let (mut kh, mut vh) = (vec![f16::ZERO; rows * d], vec![f16::ZERO; rows * d]);
            let q8 = d % crate::kv::Q8_BLOCK == 0;
            let w = Q8::row_len(d);
            let (mut kq, mut vq) = (vec![0u8; rows * w], vec![0u8; rows * w]);
            for r in 0..rows {
                let (key, value) = (&k0[r * d..(r + 1) * d], &v0[r * d..(r + 1) * d]);
                Kv::F16 {
                    keys: &mut kh,
                    values: &mut vh,
                }
                .write(r, key, value);
                if q8 {
                    Kv::Q8 {
                        keys: &mut kq,
                        values: &mut vq,
                    }
                    .write(r, key, value);
                }
            }
            // the float32 values each holds
            let widen =
                |get: &dyn Fn(usize, usize) -> f32| -> Vec<f32> { (0..rows * d).map(|i| get(i / d, i % d)).collect() };
            let (khf, vhf) = (
                widen(&|r, c| kh[r * d + c].to_f32()),
                widen(&|r, c| vh[r * d + c].to_f32()),
            );
            let (kqf, vqf) = unsafe {
                (
                    widen(&|r, c| Q8::get(kq.as_ptr().add(r * w) as *const Q8, c)),
                    widen(&|r, c| Q8::get(vq.as_ptr().add(r * w) as *const Q8, c)),
                )
            };
            let total = past + n;
            let mut tree = vec![0u8; n * total];
            for i in 0..n {
                tree[i * total..i * total + past + 1].fill(1);
                tree[i * total + past + i] = 1;
            }
            for path in Path::all().into_iter().filter(|p| path_available(*p)) {
                for threads in [1, 2] {
                    for (mask, window) in [(None, 0), (None, 20), (Some(&tree[..]), 0)] {
                        let s = Shape { window, ..s };
                        let run = |kv: Kv<'_>| {
                            let seg = [Segment {
                                n,
                                cache: Cache { kv, capacity, past },
                                mask,
                            }];
                            let mut out = vec![0.0f32; n * s.heads * d];
                            attention(&qkv, &mut out, &seg, s, threads, path, Act::F32);
                            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                        };
                        let what = format!("d {d} past {past} {path:?} {threads} window {window}");
                        let (mut a, mut b, mut c, mut e) = (kh.clone(), vh.clone(), khf.clone(), vhf.clone());
                        let got = run(Kv::F16 {
                            keys: &mut a,
                            values: &mut b,
                        });
                        let want = run(Kv::F32 {
                            keys: &mut c,
                            values: &mut e,
                        });
                        assert_eq!(got, want, "f16, {what}");
                        if q8 {
                            let (mut a, mut b, mut c, mut e) = (kq.clone(), vq.clone(), kqf.clone(), vqf.clone());
                            let got = run(Kv::Q8 {
                                keys: &mut a,
                                values: &mut b,
                            });
                            let want = run(Kv::F32 {
                                keys: &mut c,
                                values: &mut e,
                            });
                            assert_eq!(got, want, "q8_0, {what}");
                        }
                    }
                }
            }
        }
    }

    /// q8 queries against a q8_0 cache (scores by integer block products,
    /// `q8_scores`): the portable code's bits on every path and thread
    /// count, causal, windowed and under a tree's mask, within a chunk and
    /// across chunks; each causal row alone has its bits in the batch; and
    /// another function than the float scores of the same cache, close to it.
    #[test]
    fn q8_queries_on_a_q8_cache_have_the_same_bits_everywhere() {
        for (head_dim, past, capacity) in [
            (64, 37, 64),
            (32, 20, 32),
            (128, CHUNK - 4, CHUNK + 16),
            (64, 2 * CHUNK + 90, 3 * CHUNK),
        ] {
            let s = Shape::llama(0, 6, 2, head_dim, 0, 0.0);
            let (d, n, rows) = (head_dim, 5, s.kv_heads * capacity);
            let width = (s.heads + 2 * s.kv_heads) * d;
            let qkv = values(n * width, 4);
            let scaled = |x: Vec<f32>| -> Vec<f32> { x.iter().map(|v| v * 3.7).collect() };
            let (k0, v0) = (scaled(values(rows * d, 5)), scaled(values(rows * d, 6)));
            let w = Q8::row_len(d);
            let (mut kq, mut vq) = (vec![0u8; rows * w], vec![0u8; rows * w]);
            for r in 0..rows {
                Kv::Q8 {
                    keys: &mut kq,
                    values: &mut vq,
                }
                .write(r, &k0[r * d..(r + 1) * d], &v0[r * d..(r + 1) * d]);
            }
            let total = past + n;
            let mut tree = vec![0u8; n * total];
            for i in 0..n {
                tree[i * total..i * total + past + 1].fill(1);
                tree[i * total + past + i] = 1;
            }
            #[allow(clippy::too_many_arguments)]
            let run = |past: usize, m: usize, q: &[f32], mask: Option<&[u8]>, window: usize, path, threads, act| {
                let (mut a, mut b) = (kq.clone(), vq.clone());
                let kv = Kv::Q8 {
                    keys: &mut a,
                    values: &mut b,
                };
                let seg = [Segment {
                    n: m,
                    cache: Cache { kv, capacity, past },
                    mask,
                }];
                let mut out = vec![0.0f32; m * s.heads * d];
                attention(q, &mut out, &seg, Shape { window, ..s }, threads, path, act);
                out
            };
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let row = s.heads * d;
            for (mask, window) in [(None, 0), (None, 20), (Some(&tree[..]), 0)] {
                let want = bits(&run(past, n, &qkv, mask, window, Path::Portable, 1, Act::Q8));
                for path in Path::all().into_iter().filter(|p| path_available(*p)) {
                    let what = format!("d {d} past {past} {path:?} window {window} mask {}", mask.is_some());
                    for threads in [1, 2] {
                        let got = bits(&run(past, n, &qkv, mask, window, path, threads, Act::Q8));
                        assert_eq!(got, want, "{what}, {threads} threads");
                    }
                    if mask.is_none() && window == 0 {
                        for i in 0..n {
                            let alone = run(past + i, 1, &qkv[i * width..], None, 0, path, 1, Act::Q8);
                            assert_eq!(bits(&alone), want[i * row..(i + 1) * row], "row {i} alone, {what}");
                        }
                    }
                }
            }
            let float = run(past, n, &qkv, None, 0, Path::Portable, 1, Act::F32);
            let int = run(past, n, &qkv, None, 0, Path::Portable, 1, Act::Q8);
            let size = float.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let error = float.iter().zip(&int).fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
            println!("d {d} past {past}: largest change {error} of {size}");
            assert!(
                error > 0.0 && error < 0.02 * size,
                "d {d} past {past}: {error} of {size}"
            );
        }
    }

    /// A tree's row has its chain row's bits: the keys it sees, taken in
    /// their order, are those of a causal row whose cache holds just them,
    /// on every path, thread count and cache type, with the tree block
    /// inside a chunk or across a multiple of 256 (where its rows' keys
    /// fall in other chunks than their slots).
    #[test]
    fn a_tree_row_has_its_chain_rows_bits() {
        use half::f16;
        // a tree of 12 rows: the root, then branches (parents by row)
        let parents: [isize; 12] = [-1, 0, 1, 2, 0, 4, 5, 0, 7, 1, 9, 6];
        let n = parents.len();
        for (head_dim, past) in [(64, 37), (64, 250), (32, 2 * CHUNK - 5), (64, CHUNK - 1)] {
            let s = Shape::llama(0, 4, 2, head_dim, 0, 0.0);
            let d = head_dim;
            let (capacity, total) = (past + n + 16, past + n);
            let width = (s.heads + 2 * s.kv_heads) * d;
            let qkv = values(n * width, 7);
            let (k0, v0) = (
                values(s.kv_heads * capacity * d, 8),
                values(s.kv_heads * capacity * d, 9),
            );
            let mut mask = vec![0u8; n * total];
            for i in 0..n {
                mask[i * total..i * total + past].fill(1);
                let mut j = i as isize;
                while j >= 0 {
                    mask[i * total + past + j as usize] = 1;
                    j = parents[j as usize];
                }
            }
            // q8 activations change the scores of a q8_0 cache only (`q8_scores`)
            for (cache, act) in [
                ("f32", Act::F32),
                ("f16", Act::F32),
                ("q8_0", Act::F32),
                ("q8_0", Act::Q8),
            ] {
                if cache == "q8_0" && d % 32 != 0 {
                    continue;
                }
                // the stored rows of keys and values, as one buffer each per type
                let store = |k: &[f32], v: &[f32], rows: usize| -> (Vec<u8>, Vec<u8>) {
                    let w = match cache {
                        "f32" => d * 4,
                        "f16" => d * 2,
                        _ => d / 32 * 34,
                    };
                    let (mut kb, mut vb) = (vec![0u8; rows * w], vec![0u8; rows * w]);
                    for r in 0..rows {
                        let (key, value) = (&k[r * d..(r + 1) * d], &v[r * d..(r + 1) * d]);
                        let (ks, vs) = (&mut kb[r * w..(r + 1) * w], &mut vb[r * w..(r + 1) * w]);
                        match cache {
                            "f32" => {
                                for c in 0..d {
                                    ks[c * 4..c * 4 + 4].copy_from_slice(&key[c].to_le_bytes());
                                    vs[c * 4..c * 4 + 4].copy_from_slice(&value[c].to_le_bytes());
                                }
                            }
                            "f16" => {
                                for c in 0..d {
                                    ks[c * 2..c * 2 + 2].copy_from_slice(&f16::from_f32(key[c]).to_le_bytes());
                                    vs[c * 2..c * 2 + 2].copy_from_slice(&f16::from_f32(value[c]).to_le_bytes());
                                }
                            }
                            _ => Kv::Q8 { keys: ks, values: vs }.write(0, key, value),
                        }
                    }
                    (kb, vb)
                };
                let run = |kb: &mut Vec<u8>,
                           vb: &mut Vec<u8>,
                           cap: usize,
                           past: usize,
                           m: usize,
                           q: &[f32],
                           mask: Option<&[u8]>,
                           path: Path,
                           threads: usize| {
                    let kv = match cache {
                        "f32" => Kv::F32 {
                            keys: bytemuck_f32(kb),
                            values: bytemuck_f32(vb),
                        },
                        "f16" => Kv::F16 {
                            keys: bytemuck_f16(kb),
                            values: bytemuck_f16(vb),
                        },
                        _ => Kv::Q8 { keys: kb, values: vb },
                    };
                    let seg = [Segment {
                        n: m,
                        cache: Cache {
                            kv,
                            capacity: cap,
                            past,
                        },
                        mask,
                    }];
                    let mut out = vec![0.0f32; m * s.heads * d];
                    attention(q, &mut out, &seg, s, threads, path, act);
                    out
                };
                let (mut kb, mut vb) = store(&k0, &v0, s.kv_heads * capacity);
                for path in Path::all().into_iter().filter(|p| path_available(*p)) {
                    for threads in [1, 2] {
                        let tree = run(&mut kb, &mut vb, capacity, past, n, &qkv, Some(&mask), path, threads);
                        for i in 0..n {
                            // the chain: a cache of just the row's keys, the row last
                            let seen: Vec<usize> = (0..total).filter(|&j| mask[i * total + j] != 0).collect();
                            let m = seen.len();
                            let cap = m + 3;
                            let (mut kc, mut vc) =
                                (vec![0.0f32; s.kv_heads * cap * d], vec![0.0f32; s.kv_heads * cap * d]);
                            for kv in 0..s.kv_heads {
                                for (v, &j) in seen.iter().enumerate() {
                                    let (from, to) = ((kv * capacity + j) * d, (kv * cap + v) * d);
                                    kc[to..to + d].copy_from_slice(&k0[from..from + d]);
                                    vc[to..to + d].copy_from_slice(&v0[from..from + d]);
                                }
                            }
                            let (mut kcb, mut vcb) = store(&kc, &vc, s.kv_heads * cap);
                            let row = &qkv[i * width..(i + 1) * width];
                            let chain = run(&mut kcb, &mut vcb, cap, m - 1, 1, row, None, path, 1);
                            let got = &tree[i * s.heads * d..(i + 1) * s.heads * d];
                            let same = got.iter().zip(&chain).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(
                                same,
                                "row {i}, past {past}, d {d}, {cache}, {act:?}, {path:?}, {threads} threads"
                            );
                        }
                    }
                }
            }
        }
    }

    fn bytemuck_f32(b: &mut [u8]) -> &mut [f32] {
        assert!(b.len().is_multiple_of(4) && (b.as_ptr() as usize).is_multiple_of(4));
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut f32, b.len() / 4) }
    }

    fn bytemuck_f16(b: &mut [u8]) -> &mut [half::f16] {
        assert!(b.len().is_multiple_of(2) && (b.as_ptr() as usize).is_multiple_of(2));
        unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut half::f16, b.len() / 2) }
    }

    /// The float64 softmax attention of query (row i, head) over the keys `seen`.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        qkv: &[f32],
        keys: &[f32],
        vals: &[f32],
        s: Shape,
        capacity: usize,
        i: usize,
        head: usize,
        seen: &[usize],
    ) -> Vec<f64> {
        let d = s.head_dim;
        let width = (s.heads + 2 * s.kv_heads) * d;
        let kv = head / (s.heads / s.kv_heads);
        let q = &qkv[i * width + head * d..i * width + (head + 1) * d];
        let key = |j: usize| &keys[(kv * capacity + j) * d..(kv * capacity + j + 1) * d];
        let scores: Vec<f64> = seen
            .iter()
            .map(|&j| q.iter().zip(key(j)).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * s.scale as f64)
            .map(|x| {
                let c = s.softcap as f64;
                if c > 0.0 {
                    c * (x / c).tanh()
                } else {
                    x
                }
            })
            .collect();
        let top = scores.iter().cloned().fold(f64::MIN, f64::max);
        let p: Vec<f64> = scores.iter().map(|x| (x - top).exp()).collect();
        let sum: f64 = p.iter().sum();
        (0..d)
            .map(|c| {
                seen.iter()
                    .zip(&p)
                    .map(|(&j, w)| w * vals[(kv * capacity + j) * d + c] as f64)
                    .sum::<f64>()
                    / sum
            })
            .collect()
    }

    /// A float32 cache (kv_heads, capacity, d) with `past` positions before the rows of a test.
    struct F32Cache<'a> {
        keys: &'a [f32],
        values: &'a [f32],
        capacity: usize,
        past: usize,
    }

    impl F32Cache<'_> {
        /// The bits of `attention` over the `rows` of `qkv` (rows of (heads + 2·kv_heads)·d),
        /// row r at position past + r, on copies of the cache.
        fn attention_bits(
            &self,
            qkv: &[f32],
            s: Shape,
            rows: std::ops::Range<usize>,
            mask: Option<&[u8]>,
            path: Path,
            threads: usize,
        ) -> Vec<u32> {
            let width = (s.heads + 2 * s.kv_heads) * s.head_dim;
            let (mut k, mut v) = (self.keys.to_vec(), self.values.to_vec());
            let seg = [Segment {
                n: rows.len(),
                cache: Cache {
                    kv: crate::kv::Kv::F32 {
                        keys: &mut k,
                        values: &mut v,
                    },
                    capacity: self.capacity,
                    past: self.past + rows.start,
                },
                mask,
            }];
            let mut out = vec![0.0f32; rows.len() * s.heads * s.head_dim];
            attention(
                &qkv[rows.start * width..rows.end * width],
                &mut out,
                &seg,
                s,
                threads,
                path,
                Act::F32,
            );
            out.iter().map(|x| x.to_bits()).collect()
        }
    }

    fn same_bits(head_dim: usize, past: usize, capacity: usize) {
        let s = Shape::llama(0, 6, 2, head_dim, 0, 0.0);
        let (d, n) = (s.head_dim, 5);
        let width = (s.heads + 2 * s.kv_heads) * d;
        let qkv = values(n * width, 1);
        let (keys, vals) = (
            values(s.kv_heads * capacity * d, 2),
            values(s.kv_heads * capacity * d, 3),
        );
        let run_in = |rows: std::ops::Range<usize>, path: Path, threads: usize, mask: Option<&[u8]>, window: usize| {
            let cache = F32Cache {
                keys: &keys,
                values: &vals,
                capacity,
                past,
            };
            cache.attention_bits(&qkv, Shape { window, ..s }, rows, mask, path, threads)
        };
        let run = |rows: std::ops::Range<usize>, path: Path, threads: usize, mask: Option<&[u8]>| {
            run_in(rows, path, threads, mask, 0)
        };
        let all = run(0..n, Path::Portable, 1, None);
        // a sliding window of 20 positions: its own mask's bits, on every path and split;
        // softmax over exactly the 20 keys up to each row (float64 reference)
        let (window, total) = (20, past + n);
        let mut band = vec![0u8; n * total];
        for i in 0..n {
            for j in past + i + 1 - window..=past + i {
                band[i * total + j] = 1;
            }
        }
        let windowed = run_in(0..n, Path::Portable, 1, None, window);
        assert_eq!(windowed, run(0..n, Path::Portable, 1, Some(&band)));
        assert_eq!(
            run_in(0..n, Path::Portable, 1, None, total),
            all,
            "a window holding every key"
        );
        for i in 0..n {
            for head in 0..s.heads {
                let window_keys: Vec<usize> = (past + i + 1 - window..=past + i).collect();
                let causal_keys: Vec<usize> = (0..=past + i).collect();
                for (got, seen) in [(&windowed, &window_keys), (&all, &causal_keys)] {
                    let want = reference(&qkv, &keys, &vals, s, capacity, i, head, seen);
                    for c in 0..d {
                        let got = f32::from_bits(got[(i * s.heads + head) * d + c]) as f64;
                        assert!(
                            (got - want[c]).abs() < 1e-4,
                            "row {i} head {head} lane {c}: {got} vs {}",
                            want[c]
                        );
                    }
                }
            }
        }
        for path in Path::all().into_iter().filter(|p| path_available(*p)) {
            for threads in [1, 2, 3] {
                assert_eq!(run(0..n, path, threads, None), all, "{path:?} {threads}");
                assert_eq!(run_in(0..n, path, threads, None, window), windowed, "window {path:?}");
            }
            for i in 0..n {
                let one = run(i..i + 1, path, 1, None);
                assert_eq!(one, all[i * s.heads * d..(i + 1) * s.heads * d], "row {i} {path:?}");
            }
            // a tree: rows 2 and 4 see the past, row 0 and themselves
            let total = past + n;
            let mut mask = vec![0u8; n * total];
            for i in 0..n {
                for j in 0..past {
                    mask[i * total + j] = 1;
                }
                mask[i * total + past] = 1;
                mask[i * total + past + i] = 1;
            }
            let tree = run(0..n, path, 2, Some(&mask));
            let chain_first = run(0..1, path, 1, None);
            assert_eq!(tree[..s.heads * d], chain_first[..], "the root row {path:?}");
            assert_eq!(run(0..n, path, 1, Some(&mask)), tree, "a tree on one thread {path:?}");
            for i in 0..n {
                let seen: Vec<usize> = (0..total).filter(|&j| mask[i * total + j] != 0).collect();
                for head in 0..s.heads {
                    let want = reference(&qkv, &keys, &vals, s, capacity, i, head, &seen);
                    for c in 0..d {
                        let got = f32::from_bits(tree[(i * s.heads + head) * d + c]) as f64;
                        assert!(
                            (got - want[c]).abs() < 1e-4,
                            "tree row {i} head {head} lane {c} {path:?}"
                        );
                    }
                }
            }
        }
    }
}
