//! One Llama decoder layer over weights at a GGUF file's precision, for the
//! few positions of a decode or verification step (and prefill):
//! RMSNorm → q, k, v (one stacked product) → RoPE → the keys and values
//! written into the cache → attention over the cache → o → residual →
//! RMSNorm → gate, up (one stacked product) → SiLU(gate)·up → down →
//! residual. It replaces some twenty small torch operations per layer,
//! whose overhead is most of a small model's step on a CPU.
//! An architecture's differences (`Extras`, `Shape`): q, k, v biases, q/k
//! head norms, Gemma's post-norms, GELU gate, score scale and soft-capping,
//! and a layer's own rotary table.
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
use crate::quant::{qlinear, Act, Path, QType};

/// The sizes of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub inter: usize,
    pub eps: f32,
    /// A sliding window: a position sees the `window` positions up to
    /// itself (0: every earlier one).
    pub window: usize,
    /// The attention scores' scale: 1/√d (Gemma's 27B models: 1/√(hidden/heads)).
    pub scale: f32,
    /// Gemma 2's soft-capping of the scaled scores, c·tanh(score/c) (0: none).
    pub softcap: f32,
    /// The MLP's gate: GELU (its tanh form, Gemma) instead of SiLU.
    pub gelu: bool,
    /// The rotary table the layer takes in a `Stack` (0: the model's; 1:
    /// the local one of Gemma 3's sliding layers).
    pub rotary: usize,
}

impl Shape {
    /// A Llama layer's shape: scale 1/√d, no soft-capping, SiLU, the model's rotary.
    pub fn llama(hidden: usize, heads: usize, kv_heads: usize, head_dim: usize, inter: usize, eps: f32) -> Shape {
        Shape {
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
            eps,
            window: 0,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: 0.0,
            gelu: false,
            rotary: 0,
        }
    }
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
        act: Act,
    ) -> crate::Result<()> {
        match self {
            Proj::One(w) => qlinear(x, w.packed, w.q, out, n, k, rows, threads, path, act),
            Proj::Parts(parts) => {
                if parts.iter().map(|(_, m)| m).sum::<usize>() != rows {
                    return Err(bad(format!("stacked parts do not add up to {rows} rows")));
                }
                let mut at = 0;
                for (w, m) in parts {
                    let mut part = vec![0.0f32; n * m];
                    qlinear(x, w.packed, w.q, &mut part, n, k, *m, threads, path, act)?;
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
    /// The architecture's differences (`Extras::NONE` for a Llama layer).
    pub extras: Extras<'a>,
}

/// What a layer adds to a Llama layer. Applied to the q, k, v rows right
/// after their product and before RoPE: Qwen2's biases (heads·d +
/// 2·kv_heads·d, in q, k, v order), the RMS norms of each query head and
/// each key head of Qwen3 and Gemma 3 (d weights each, the layer's eps).
/// Gemma's post-norms (hidden weights each): RMS norms of the attention's
/// output and of the MLP's output before each is added to the residual.
#[derive(Clone, Copy, Default)]
pub struct Extras<'a> {
    pub qkv_bias: Option<&'a [f32]>,
    pub qk_norms: Option<(&'a [f32], &'a [f32])>,
    pub post_norms: Option<(&'a [f32], &'a [f32])>,
}

impl Extras<'_> {
    /// A Llama layer's: none.
    pub const NONE: Extras<'static> = Extras {
        qkv_bias: None,
        qk_norms: None,
        post_norms: None,
    };
}

/// One sequence's cache in a layer: keys and values (kv_heads, capacity,
/// d) of one stored type (`kv::Kv`), positions 0..past filled; this step
/// writes past..past + n.
pub struct Cache<'a> {
    pub kv: crate::kv::Kv<'a>,
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

impl<'a> Weights<'a> {
    /// A layer's weights from its packed products as a file stores them:
    /// q, k, v stacked (one weight) or apart (three), o, gate and up stacked
    /// (one) or apart (two), down: four to seven weights, (qkv, o, gate_up,
    /// down) up to (q, k, v, o, gate, up, down) (split by `s`).
    pub fn of(
        packed: &[Weight<'a>],
        s: &Shape,
        attn_norm: &'a [f32],
        ffn_norm: &'a [f32],
        extras: Extras<'a>,
    ) -> crate::Result<Weights<'a>> {
        let (qd, kvd) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let apart_qkv =
            |q: &Weight<'a>, k: &Weight<'a>, v: &Weight<'a>| Proj::Parts(vec![(*q, qd), (*k, kvd), (*v, kvd)]);
        let apart_gate_up = |g: &Weight<'a>, u: &Weight<'a>| Proj::Parts(vec![(*g, s.inter), (*u, s.inter)]);
        let (qkv, o, gate_up, down) = match packed {
            [qkv, o, gate_up, down] => (Proj::One(*qkv), *o, Proj::One(*gate_up), *down),
            [qkv, o, gate, up, down] => (Proj::One(*qkv), *o, apart_gate_up(gate, up), *down),
            [q, k, v, o, gate_up, down] => (apart_qkv(q, k, v), *o, Proj::One(*gate_up), *down),
            [q, k, v, o, gate, up, down] => (apart_qkv(q, k, v), *o, apart_gate_up(gate, up), *down),
            _ => {
                return Err(SpecError::Shape(format!(
                    "a layer has {} weights; expected 4 to 7: (qkv or q, k, v; o; gate_up or gate, up; down)",
                    packed.len()
                )))
            }
        };
        Ok(Weights {
            qkv,
            o,
            gate_up,
            down,
            attn_norm,
            ffn_norm,
            extras,
        })
    }
}

/// The shapes of one step's arrays, checked before any is borrowed: x (N,
/// hidden) with N = Σ lengths; one past per sequence; one keys and one
/// values array (kv_heads, capacity, head_dim) per sequence and layer,
/// sequence-major (`layers[l]` the shape of layer l); a mask for one
/// sequence only. `what` names the call in the message.
pub struct StepShapes<'s> {
    pub x: &'s [usize],
    pub lengths: &'s [usize],
    pub pasts: usize,
    pub keys: Vec<&'s [usize]>,
    pub values: Vec<&'s [usize]>,
    /// Which key arrays hold q8_0 rows (bytes: `kv::Q8_BYTES` per 32
    /// values, so their last axis is head_dim / 32 · 34); none if empty.
    pub q8: Vec<bool>,
    pub masked: bool,
}

impl StepShapes<'_> {
    pub fn check(&self, what: &str, layers: &[Shape], hidden: usize) -> crate::Result<()> {
        let (sequences, depth) = (self.lengths.len(), layers.len());
        if sequences == 0
            || depth == 0
            || self.pasts != sequences
            || self.keys.len() != sequences * depth
            || self.values.len() != self.keys.len()
        {
            return Err(SpecError::Shape(format!(
                "{what}: {} keys, {} values, {} pasts for {sequences} sequences of {depth} layers; \
                 pass one past per sequence and one key and value array per sequence and layer \
                 (sequence-major), at least one",
                self.keys.len(),
                self.values.len(),
                self.pasts
            )));
        }
        if self.masked && sequences != 1 {
            return Err(SpecError::Shape(format!(
                "{what}: a mask is for one sequence (a tree); a batch of {sequences} sequences is causal"
            )));
        }
        let n: usize = self.lengths.iter().sum();
        if self.x != [n, hidden] {
            return Err(SpecError::Shape(format!(
                "{what}: x is {:?}; expected ({n}, {hidden}) for the lengths given",
                self.x
            )));
        }
        for (i, (k, v)) in self.keys.iter().zip(&self.values).enumerate() {
            let l = &layers[i % depth];
            let q8 = self.q8.get(i).copied().unwrap_or(false);
            if q8 && !l.head_dim.is_multiple_of(crate::kv::Q8_BLOCK) {
                return Err(SpecError::Shape(format!(
                    "{what}: layer {}: a q8_0 cache holds blocks of {} values; the head size {} is not a \
                     multiple: use an f32 or f16 cache",
                    i % depth,
                    crate::kv::Q8_BLOCK,
                    l.head_dim
                )));
            }
            let width = if q8 {
                l.head_dim / crate::kv::Q8_BLOCK * crate::kv::Q8_BYTES
            } else {
                l.head_dim
            };
            if k.len() != 3 || *k != [l.kv_heads, k[1], width] || v != k {
                return Err(SpecError::Shape(format!(
                    "{what}: sequence {} layer {}: keys {k:?}, values {v:?}; expected ({}, capacity, {width}){}",
                    i / depth,
                    i % depth,
                    l.kv_heads,
                    if q8 { " bytes of q8_0 rows" } else { "" }
                )));
            }
        }
        Ok(())
    }
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
    act: Act,
) -> crate::Result<()> {
    let (h, d) = (s.hidden, s.head_dim);
    if s.heads == 0 || s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) || d == 0 || !d.is_multiple_of(2) {
        return Err(bad(format!(
            "{} heads over {} key-value heads of size {d}",
            s.heads, s.kv_heads
        )));
    }
    if d > crate::attention::DMAX {
        return Err(bad(format!(
            "head size {d}; this layer takes at most {}",
            crate::attention::DMAX
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
    if let Some(b) = w.extras.qkv_bias {
        if b.len() != qd + 2 * kvd {
            return Err(bad(format!(
                "q, k, v biases of {} values; expected {}",
                b.len(),
                qd + 2 * kvd
            )));
        }
    }
    pair_sized(
        w.extras.post_norms,
        h,
        "post-attention and post-MLP norms",
        "the hidden size",
    )?;
    pair_sized(w.extras.qk_norms, d, "q and k norms", "the head size")?;
    for (i, g) in segments.iter().enumerate() {
        let total = g.cache.past + g.n;
        if matches!(g.cache.kv, crate::kv::Kv::Q8 { .. }) && !d.is_multiple_of(crate::kv::Q8_BLOCK) {
            return Err(bad(format!(
                "sequence {i}: a q8_0 cache holds blocks of {} values; the head size {d} is not a \
                 multiple: use an f32 or f16 cache",
                crate::kv::Q8_BLOCK
            )));
        }
        let cache_len = s.kv_heads * g.cache.capacity * g.cache.kv.row_len(d);
        let (keys, values) = g.cache.kv.lens();
        if keys != cache_len || values != cache_len || total > g.cache.capacity {
            return Err(bad(format!(
                "sequence {i}: a {} cache of {keys} key and {values} value elements for capacity {} and \
                 {total} positions",
                g.cache.kv.name(),
                g.cache.capacity
            )));
        }
        if let Some(m) = g.mask {
            if s.window > 0 && total > s.window {
                return Err(bad(format!(
                    "sequence {i}: a tree's mask over {total} positions under a sliding window of {}; \
                     a tree or window drafter runs only while the context fits the window",
                    s.window
                )));
            }
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
    let mut laps = crate::probe::Laps::start();
    let mut buffers = BUFFERS.with_borrow_mut(std::mem::take);
    let Buffers {
        xn,
        qkv,
        att,
        o,
        gu,
        gated,
    } = &mut buffers;
    let row = qd + 2 * kvd;
    let (xn, qkv, att) = (sized(xn, n * h), sized(qkv, n * row), sized(att, n * qd));
    let (o, gu, gated) = (sized(o, n * h), sized(gu, n * 2 * s.inter), sized(gated, n * s.inter));
    crate::rowwise::rms_norm(path, x, w.attn_norm, s.eps, xn, h);
    laps.lap(0);
    w.qkv.apply(xn, qkv, n, h, row, threads, path, act)?;
    extras(qkv, w.extras, s, path);
    laps.lap(1);
    let mut at = 0;
    for g in segments.iter_mut() {
        for i in 0..g.n {
            let r = at + i;
            let (c, sn) = (&cos[r * d..(r + 1) * d], &sin[r * d..(r + 1) * d]);
            for head in 0..s.heads + s.kv_heads {
                rope(&mut qkv[r * row + head * d..r * row + (head + 1) * d], c, sn);
            }
            let cache = &mut g.cache;
            let from = r * row + qd; // the row's keys, then its values
            let (keys, values) = (&qkv[from..from + kvd], &qkv[from + kvd..from + 2 * kvd]);
            cache.kv.write_position(cache.capacity, cache.past + i, d, keys, values);
        }
        at += g.n;
    }
    laps.lap(2);
    crate::attention::attention(qkv, att, segments, s, threads, path, act);
    laps.lap(3);
    qlinear(att, w.o.packed, w.o.q, o, n, qd, h, threads, path, act)?;
    let post = w.extras.post_norms;
    add_normed(x, o, post.map(|p| p.0), xn, s.eps, path, h);
    laps.lap(4);
    // MLP
    crate::rowwise::rms_norm(path, x, w.ffn_norm, s.eps, xn, h);
    laps.lap(0);
    w.gate_up.apply(xn, gu, n, h, 2 * s.inter, threads, path, act)?;
    laps.lap(5);
    if s.gelu {
        crate::rowwise::gelu_mul(path, gu, gated, s.inter);
    } else {
        crate::rowwise::silu_mul(path, gu, gated, s.inter);
    }
    laps.lap(6);
    qlinear(gated, w.down.packed, w.down.q, o, n, s.inter, h, threads, path, act)?;
    add_normed(x, o, post.map(|p| p.1), xn, s.eps, path, h);
    laps.lap(7);
    BUFFERS.with_borrow_mut(|kept| *kept = buffers);
    Ok(())
}

/// A layer's intermediate rows (normed x, q|k|v, attention, the output
/// projections, gate|up, the gated rows), kept by the calling thread from
/// layer to layer and call to call: each is written whole before it is
/// read, so none is zeroed (zeroed per layer, they cost 0.5 MB of writes
/// a layer at 17 positions).
#[derive(Default)]
struct Buffers {
    xn: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gu: Vec<f32>,
    gated: Vec<f32>,
}

thread_local! {
    static BUFFERS: std::cell::RefCell<Buffers> = std::cell::RefCell::new(Buffers::default());
}

/// The first `len` values of `v`, grown (never shrunk) to hold them.
fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// x += o, or x += RMSNorm(o)·w where the layer post-norms (`norm`), the
/// normed rows in `scratch` (N, hidden: a buffer free at that point).
fn add_normed(x: &mut [f32], o: &[f32], norm: Option<&[f32]>, scratch: &mut [f32], eps: f32, path: Path, h: usize) {
    let added = match norm {
        Some(w) => {
            crate::rowwise::rms_norm(path, o, w, eps, scratch, h);
            &*scratch
        }
        None => o,
    };
    for (a, b) in x.iter_mut().zip(added) {
        *a += b;
    }
}

/// A pair of a layer's weights (`what`), each of `len` values (`size` names it), if present.
fn pair_sized(pair: Option<(&[f32], &[f32])>, len: usize, what: &str, size: &str) -> crate::Result<()> {
    match pair {
        Some((a, b)) if a.len() != len || b.len() != len => Err(bad(format!(
            "{what} of {} and {} weights; expected {size} {len}",
            a.len(),
            b.len()
        ))),
        _ => Ok(()),
    }
}

/// A whole decoder: its layers, the final norm and the LM head (its logits
/// soft-capped, c·tanh(logit/c), where `softcap` is not 0: Gemma 2).
pub struct Stack<'a> {
    pub layers: Vec<(Weights<'a>, Shape)>,
    pub norm: &'a [f32],
    pub eps: f32,
    pub head: Weight<'a>,
    pub vocab: usize,
    pub softcap: f32,
}

/// The rotary tables of a step's N rows, (cos, sin) (N, d) each: the
/// model's, then any a layer names by `Shape::rotary` (Gemma 3's local one).
pub type Tables<'a> = [(&'a [f32], &'a [f32])];

/// The whole stack over `x` (N, hidden) in place: every layer (`caches[l]`
/// the segments' caches of layer l, `tables[shape.rotary]` its rotary), the
/// final norm of every row into `states` (N, hidden), then the LM head on
/// the rows `rows` into `logits` (len(rows), vocab). One call for a
/// forward: a step's Python is the embedding lookup and the rotary tables.
///
/// `panels`: empty (every row's whole vocabulary), or one entry per row of
/// `rows`: None (its whole vocabulary) or the vocabulary panels (16 ids
/// each, `quant::qlinear_panels`) whose logits the row needs, the rest of
/// its row NaN: a grammar's masked rows read only the panels holding an
/// allowed id. The rows with the whole vocabulary share one pass over the
/// head; a row with panels listed reads those panels alone. Every logit
/// computed is the same bits either way.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    x: &mut [f32],
    tables: &Tables<'_>,
    caches: &mut [Vec<Segment<'_>>],
    stack: &Stack<'_>,
    rows: &[usize],
    panels: &[Option<&[usize]>],
    logits: &mut [f32],
    states: &mut [f32],
    threads: usize,
    path: Path,
    act: Act,
) -> crate::Result<()> {
    if caches.len() != stack.layers.len() || stack.layers.is_empty() {
        return Err(bad(format!(
            "{} layers of caches for a stack of {} layers",
            caches.len(),
            stack.layers.len()
        )));
    }
    let h = stack.layers[0].1.hidden;
    let n = x.len() / h.max(1);
    if x.len() != n * h || states.len() != n * h || stack.norm.len() != h {
        return Err(bad(format!(
            "x and states hold {} and {} values; expected N · {h}",
            x.len(),
            states.len()
        )));
    }
    if logits.len() != rows.len() * stack.vocab || rows.iter().any(|&r| r >= n) {
        return Err(bad(format!(
            "logits of {} values for rows {rows:?} of {n}; expected len(rows) · {} and rows below {n}",
            logits.len(),
            stack.vocab
        )));
    }
    if !panels.is_empty() && panels.len() != rows.len() {
        return Err(bad(format!(
            "{} lists of head panels for {} rows; expected none or one per row",
            panels.len(),
            rows.len()
        )));
    }
    for (i, ((w, s), segments)) in stack.layers.iter().zip(caches.iter_mut()).enumerate() {
        let Some(&(cos, sin)) = tables.get(s.rotary) else {
            return Err(bad(format!(
                "layer {i} takes rotary table {}; {} given",
                s.rotary,
                tables.len()
            )));
        };
        layer(x, cos, sin, segments, w.clone(), *s, threads, path, act)?;
    }
    crate::rowwise::rms_norm(path, x, stack.norm, stack.eps, states, h);
    head(stack, states, rows, panels, logits, threads, path, act)?;
    if stack.softcap > 0.0 {
        let c = stack.softcap;
        for v in logits.iter_mut() {
            *v = c * (*v / c).tanh();
        }
    }
    Ok(())
}

/// The LM head of `forward` on the final-normed `states` (N, hidden): every
/// row's logits, or for a row with panels listed those panels' (the rest of
/// its row NaN). The passes over the head (`head_plan`): the rows with their
/// whole vocabulary, and the listed rows a whole pass is cheaper for, share
/// one pass; the other listed rows share one pass over their panels' union,
/// or each read its own panels where that reads less. Every logit written is
/// the same bits whichever pass computed it (a row's outputs depend on that
/// row alone).
#[allow(clippy::too_many_arguments)]
fn head(
    stack: &Stack<'_>,
    states: &[f32],
    rows: &[usize],
    panels: &[Option<&[usize]>],
    logits: &mut [f32],
    threads: usize,
    path: Path,
    act: Act,
) -> crate::Result<()> {
    let (h, vocab) = (stack.norm.len(), stack.vocab);
    let listed = |i: usize| panels.get(i).copied().flatten();
    let lists: Vec<Option<&[usize]>> = (0..rows.len()).map(listed).collect();
    let plan = head_plan(&lists, vocab.div_ceil(crate::quant::PANEL));
    let picked = |which: &[usize]| {
        let mut out = vec![0.0f32; which.len() * h];
        for (i, &w) in which.iter().enumerate() {
            out[i * h..(i + 1) * h].copy_from_slice(&states[rows[w] * h..(rows[w] + 1) * h]);
        }
        out
    };
    let (w, q) = (stack.head.packed, stack.head.q);
    let pass = |which: &[usize], union: Option<&[usize]>, logits: &mut [f32]| -> crate::Result<()> {
        if which.is_empty() {
            return Ok(());
        }
        let x = picked(which);
        if union.is_none() && lists.iter().all(Option::is_none) {
            // every row whole (`which` is then every row, in order): straight into the logits
            return qlinear(&x, w, q, logits, which.len(), h, vocab, threads, path, act);
        }
        let mut out = vec![0.0f32; which.len() * vocab];
        match union {
            None => qlinear(&x, w, q, &mut out, which.len(), h, vocab, threads, path, act)?,
            Some(list) => {
                crate::quant::qlinear_panels(&x, w, q, &mut out, which.len(), h, vocab, list, threads, path, act)?
            }
        }
        for (j, &i) in which.iter().enumerate() {
            let (from, row) = (
                &out[j * vocab..(j + 1) * vocab],
                &mut logits[i * vocab..(i + 1) * vocab],
            );
            match lists[i] {
                None => row.copy_from_slice(from),
                Some(own) => {
                    row.fill(f32::NAN);
                    for &panel in own {
                        let span = panel * crate::quant::PANEL..((panel + 1) * crate::quant::PANEL).min(vocab);
                        row[span.clone()].copy_from_slice(&from[span]);
                    }
                }
            }
        }
        Ok(())
    };
    pass(&plan.whole, None, logits)?;
    pass(&plan.shared, Some(&plan.union), logits)?;
    for &i in &plan.alone {
        let row = &mut logits[i * vocab..(i + 1) * vocab];
        row.fill(f32::NAN);
        let x = &states[rows[i] * h..(rows[i] + 1) * h];
        let list = lists[i].unwrap_or_default();
        crate::quant::qlinear_panels(x, w, q, row, 1, h, vocab, list, threads, path, act)?;
    }
    Ok(())
}

/// A row's products on a head panel, in units of reading the panel (the
/// head over 5 rows against over 1: 1.38 and 1.91 ms in float32, (1.91 −
/// 1.38) / (4 · 1.38) ≈ 0.1; q8 less): what `head_plan` weighs bytes against.
const HEAD_ROW_COST: f64 = 0.1;

/// How `head` passes over the head's panels: `whole` the rows of one pass
/// over every panel, `shared` the rows of one pass over `union`, `alone`
/// the rows that read their own panels each.
#[derive(Debug, PartialEq, Eq)]
struct HeadPlan {
    whole: Vec<usize>,
    shared: Vec<usize>,
    union: Vec<usize>,
    alone: Vec<usize>,
}

/// The cheapest of a few plans for rows with `lists` (None: the whole
/// vocabulary of `panels` panels) by the cost model: a pass over P panels
/// for r rows costs P·(1 + `HEAD_ROW_COST`·(r − 1)). A listed row joins
/// the whole pass where that costs less than its own panels; the listed
/// rows left share one pass over their union where that costs less than
/// a pass each.
fn head_plan(lists: &[Option<&[usize]>], panels: usize) -> HeadPlan {
    let cost = |p: usize, r: usize| p as f64 * (1.0 + HEAD_ROW_COST * (r.max(1) - 1) as f64);
    let mut whole: Vec<usize> = (0..lists.len()).filter(|&i| lists[i].is_none()).collect();
    let mut listed: Vec<usize> = (0..lists.len()).filter(|&i| lists[i].is_some()).collect();
    let size = |i: usize| lists[i].map_or(panels, <[usize]>::len);
    if !whole.is_empty() {
        // one more row in a pass that runs anyway, against its own panels read
        listed.retain(|&i| {
            let join = cost(panels, 2) - cost(panels, 1) < cost(size(i), 1);
            if join {
                whole.push(i);
            }
            !join
        });
        whole.sort_unstable();
    }
    let mut union: Vec<usize> = listed
        .iter()
        .flat_map(|&i| lists[i].unwrap_or_default().iter().copied())
        .collect();
    union.sort_unstable();
    union.dedup();
    let separate: f64 = listed.iter().map(|&i| cost(size(i), 1)).sum();
    if listed.len() > 1 && cost(union.len(), listed.len()) < separate {
        HeadPlan {
            whole,
            shared: listed,
            union,
            alone: Vec::new(),
        }
    } else {
        HeadPlan {
            whole,
            shared: Vec::new(),
            union: Vec::new(),
            alone: listed,
        }
    }
}

/// The extras (see `Extras`) on `qkv` (N, heads·d + 2·kv_heads·d) in place,
/// each row alone: + bias, then each query head and key head RMS-normed.
fn extras(qkv: &mut [f32], e: Extras<'_>, s: Shape, path: Path) {
    let d = s.head_dim;
    let (qd, kvd) = (s.heads * d, s.kv_heads * d);
    let row = qd + 2 * kvd;
    if let Some(bias) = e.qkv_bias {
        for r in qkv.chunks_exact_mut(row) {
            for (v, b) in r.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
    if let Some((qn, kn)) = e.qk_norms {
        let mut heads = vec![0.0f32; qd.max(kvd)];
        for r in qkv.chunks_exact_mut(row) {
            for (range, weight) in [(0..qd, qn), (qd..qd + kvd, kn)] {
                let src = &mut heads[..range.len()];
                src.copy_from_slice(&r[range.clone()]);
                crate::rowwise::rms_norm(path, src, weight, s.eps, &mut r[range], d);
            }
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
        let s = Shape::llama(16, 2, 1, 8, 24, 1e-5);
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
            extras: Extras::NONE,
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
                    kv: crate::kv::Kv::F32 {
                        keys: &mut k,
                        values: &mut v,
                    },
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
                Act::F32,
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
                    kv: crate::kv::Kv::F32 { keys: k, values: v },
                    capacity,
                    past: pasts[i],
                },
                mask: None,
            })
            .collect();
        layer(&mut xs, &cos, &sin, &mut segs, w(), s, 2, path, Act::F32).unwrap();
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
                kv: crate::kv::Kv::F32 {
                    keys: &mut k,
                    values: &mut v,
                },
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
            Act::F32,
        )
        .unwrap_err();
        assert!(e.to_string().contains("sequence 0"), "{e}");
        // a head of size 0 is an error, not a division by zero in attention
        let e = layer(
            &mut x[..h].to_vec(),
            &cos[..d],
            &sin[..d],
            &mut [],
            w(),
            Shape { head_dim: 0, ..s },
            2,
            path,
            Act::F32,
        )
        .unwrap_err();
        assert!(e.to_string().contains("size 0"), "{e}");
    }

    #[test]
    fn the_head_plan_shares_passes_where_they_read_less() {
        let (dense, sparse, other): (Vec<usize>, Vec<usize>, Vec<usize>) =
            ((0..40).collect(), vec![3, 4], vec![90, 91]);
        // a dense list joins a whole pass that runs anyway; a sparse one does not
        let plan = head_plan(&[None, Some(&dense), Some(&sparse)], 100);
        assert_eq!((plan.whole, plan.alone), (vec![0, 1], vec![2]));
        // overlapping lists share a pass over their union
        let plan = head_plan(&[Some(&sparse), Some(&sparse[..1]), Some(&sparse)], 100);
        assert_eq!((plan.shared, plan.union), (vec![0, 1, 2], vec![3, 4]));
        assert!(plan.whole.is_empty() && plan.alone.is_empty());
        // disjoint lists over few rows read less each alone: 4 panels for 2 rows cost 4.4 > 2 + 2
        let plan = head_plan(&[Some(&sparse), Some(&other)], 100);
        assert_eq!((plan.alone, plan.shared), (vec![0, 1], vec![]));
        // every row whole: one pass
        let plan = head_plan(&[None, None], 100);
        assert_eq!(plan.whole, vec![0, 1]);
    }

    /// A step's shapes and a layer's weight count are checked in the core,
    /// each error naming what is wrong and what was expected.
    #[test]
    fn bad_step_shapes_and_weight_counts_are_shape_errors() {
        let s = Shape::llama(16, 2, 1, 8, 24, 1e-5);
        let kv = [1usize, 32, 8];
        let good = || StepShapes {
            x: &[5, 16],
            lengths: &[3, 2],
            pasts: 2,
            keys: vec![&kv[..]; 4],
            values: vec![&kv[..]; 4],
            q8: Vec::new(),
            masked: false,
        };
        let layers = [s, s];
        good().check("t", &layers, 16).unwrap();
        let message = |shapes: StepShapes| match shapes.check("t", &layers, 16) {
            Err(SpecError::Shape(m)) => m,
            other => panic!("expected a shape error, got {:?}", other.map(|_| ())),
        };
        assert!(message(StepShapes { x: &[4, 16], ..good() }).contains("expected (5, 16)"));
        assert!(message(StepShapes { pasts: 1, ..good() }).contains("1 pasts"));
        assert!(message(StepShapes { masked: true, ..good() }).contains("a mask is for one sequence"));
        let wrong = [2usize, 32, 8];
        let mut keys = vec![&kv[..]; 4];
        keys[3] = &wrong;
        assert!(message(StepShapes { keys, ..good() }).contains("sequence 1 layer 1"));
        let packed = vec![0u8; 4];
        let w = Weight {
            packed: &packed,
            q: QType::F32,
        };
        let norm = [0.0f32; 16];
        for count in 4..=7 {
            assert!(Weights::of(&vec![w; count], &s, &norm, &norm, Extras::NONE).is_ok());
        }
        for count in [3, 8] {
            match Weights::of(&vec![w; count], &s, &norm, &norm, Extras::NONE) {
                Err(SpecError::Shape(m)) => assert!(m.contains(&format!("has {count} weights")), "{m}"),
                _ => panic!("{count} weights must be a shape error"),
            }
        }
    }
}
