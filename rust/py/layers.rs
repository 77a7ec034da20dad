//! The decoder stack's bindings: `LlamaStack` (one call per forward) and `llama_layer`.

use super::*;

/// An array a `LlamaStack` reads on every call: kept alive by its reference,
/// and read without a borrow check (nothing writes a model's weights).
pub(super) struct Held<T: numpy::Element> {
    _array: Py<PyArray1<T>>,
    ptr: usize,
    len: usize,
}

impl<T: numpy::Element> Held<T> {
    fn of(array: Bound<'_, PyArray1<T>>, what: &str) -> PyResult<Self> {
        let view = array.readonly();
        let slice = c_slice(&view, what)?;
        let (ptr, len) = (slice.as_ptr() as usize, slice.len());
        drop(view);
        Ok(Held {
            _array: array.unbind(),
            ptr,
            len,
        })
    }

    fn slice(&self) -> &[T] {
        // SAFETY: the array is alive (held) and contiguous (checked when
        // held); a model's weights are never written after loading.
        unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len) }
    }
}

/// A cache's keys or values as Python passes them: float32 or float16
/// (kv_heads, capacity, head_dim), or uint8 q8_0 rows (kv_heads, capacity,
/// head_dim / 32 · 34: ggml's `block_q8_0`, see `kv.rs`), borrowed for writing.
pub(super) enum CacheArray<'py> {
    F32(numpy::PyReadwriteArray3<'py, f32>),
    F16(numpy::PyReadwriteArray3<'py, half::f16>),
    Q8(numpy::PyReadwriteArray3<'py, u8>),
}

impl<'py> CacheArray<'py> {
    /// `a` (named `what` in errors) borrowed for writing.
    fn of(a: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        let busy = |e: numpy::BorrowError| {
            PyValueError::new_err(format!("{what} cannot be written ({e}); pass each cache array once"))
        };
        if let Ok(x) = a.cast::<numpy::PyArray3<f32>>() {
            return x.try_readwrite().map(CacheArray::F32).map_err(busy);
        }
        if let Ok(x) = a.cast::<numpy::PyArray3<half::f16>>() {
            return x.try_readwrite().map(CacheArray::F16).map_err(busy);
        }
        if let Ok(x) = a.cast::<numpy::PyArray3<u8>>() {
            return x.try_readwrite().map(CacheArray::Q8).map_err(busy);
        }
        let got = match a.getattr("dtype").and_then(|t| t.str()) {
            Ok(t) => format!(
                "a {t} array of {} dimensions",
                a.getattr("ndim").map_or(0, |n| n.extract::<usize>().unwrap_or(0))
            ),
            Err(_) => format!("a {}", a.get_type().name().map_or("?".into(), |n| n.to_string())),
        };
        Err(PyValueError::new_err(format!(
            "{what} is {got}; expected a float32 or float16 array (kv_heads, capacity, head_dim), \
             or uint8 q8_0 rows (kv_heads, capacity, head_dim / 32 · 34)"
        )))
    }

    fn shape(&self) -> &[usize] {
        match self {
            CacheArray::F32(a) => a.shape(),
            CacheArray::F16(a) => a.shape(),
            CacheArray::Q8(a) => a.shape(),
        }
    }

    fn q8(&self) -> bool {
        matches!(self, CacheArray::Q8(_))
    }

    fn name(&self) -> &'static str {
        match self {
            CacheArray::F32(_) => "float32",
            CacheArray::F16(_) => "float16",
            CacheArray::Q8(_) => "uint8 (q8_0)",
        }
    }

    /// Every sequence's arrays borrowed (`what` names the argument).
    fn all(arrays: &[Bound<'py, PyAny>], what: &str) -> PyResult<Vec<Self>> {
        arrays
            .iter()
            .enumerate()
            .map(|(i, a)| CacheArray::of(a, &format!("{what}[{i}]")))
            .collect()
    }
}

/// Sequence i's keys and values as one stored type (`call` names the call in errors).
fn kv_of<'a>(
    keys: &'a mut CacheArray<'_>,
    values: &'a mut CacheArray<'_>,
    i: usize,
    call: &str,
) -> PyResult<crate::kv::Kv<'a>> {
    let contiguous = |what: String| PyValueError::new_err(format!("{call}: {what} must be C-contiguous"));
    Ok(match (keys, values) {
        (CacheArray::F32(k), CacheArray::F32(v)) => crate::kv::Kv::F32 {
            keys: k.as_slice_mut().map_err(|_| contiguous(format!("keys[{i}]")))?,
            values: v.as_slice_mut().map_err(|_| contiguous(format!("values[{i}]")))?,
        },
        (CacheArray::F16(k), CacheArray::F16(v)) => crate::kv::Kv::F16 {
            keys: k.as_slice_mut().map_err(|_| contiguous(format!("keys[{i}]")))?,
            values: v.as_slice_mut().map_err(|_| contiguous(format!("values[{i}]")))?,
        },
        (CacheArray::Q8(k), CacheArray::Q8(v)) => crate::kv::Kv::Q8 {
            keys: k.as_slice_mut().map_err(|_| contiguous(format!("keys[{i}]")))?,
            values: v.as_slice_mut().map_err(|_| contiguous(format!("values[{i}]")))?,
        },
        (k, v) => {
            return Err(PyValueError::new_err(format!(
                "{call}: keys[{i}] is {} but values[{i}] is {}; a cache stores its keys and values in one type",
                k.name(),
                v.name()
            )));
        }
    })
}

pub(super) struct HeldLayer {
    weights: Vec<(Held<u8>, crate::quant::QType)>,
    attn_norm: Held<f32>,
    ffn_norm: Held<f32>,
    qkv_bias: Option<Held<f32>>,
    qk_norms: Option<(Held<f32>, Held<f32>)>,
    post_norms: Option<(Held<f32>, Held<f32>)>,
    shape: crate::llama::Shape,
}

/// A GGUF model's whole decoder for one call per forward (`llama::forward`):
/// each layer's packed weights (qkv, o, gate_up, down; or q, k, v, o, gate,
/// up, down), norms and shape, the final norm, and the LM head.
#[pyclass(frozen, module = "specdec_rs._core")]
pub(super) struct LlamaStack {
    layers: Vec<HeldLayer>,
    norm: Held<f32>,
    eps: f32,
    head: (Held<u8>, crate::quant::QType),
    vocab: usize,
    hidden: usize,
    softcap: f32,
}

/// Two float32 matrices handed back to Python.
type Arrays2<'py> = (Bound<'py, PyArray2<f32>>, Bound<'py, PyArray2<f32>>);

/// (heads, kv heads, head size, intermediate size, eps, sliding window or
/// 0, score scale, score soft-cap or 0, GELU gate, rotary table): `llama::Shape`.
type Dims = (usize, usize, usize, usize, f32, usize, f32, f32, bool, usize);

/// Two optional float32 weights of a layer.
type PairSpec<'py> = Option<(Bound<'py, PyArray1<f32>>, Bound<'py, PyArray1<f32>>)>;

/// A layer's optional q, k, v biases, (q norm, k norm) and (post-attention
/// norm, post-MLP norm) weights.
type ExtrasSpec<'py> = (Option<Bound<'py, PyArray1<f32>>>, PairSpec<'py>, PairSpec<'py>);

type LayerSpec<'py> = (
    Vec<(Bound<'py, PyArray1<u8>>, u32)>,
    Bound<'py, PyArray1<f32>>,
    Bound<'py, PyArray1<f32>>,
    Dims,
    ExtrasSpec<'py>,
);

pub(super) fn shape_of(
    hidden: usize,
    (heads, kv_heads, head_dim, inter, eps, window, scale, softcap, gelu, rotary): Dims,
) -> PyResult<crate::llama::Shape> {
    let (scale_ok, softcap_ok) = (scale.is_finite() && scale > 0.0, softcap.is_finite() && softcap >= 0.0);
    if !(scale_ok && softcap_ok) {
        return Err(PyValueError::new_err(format!(
            "a layer's score scale {scale} and soft-cap {softcap}: expected a positive scale and a \
             soft-cap of 0 (none) or more"
        )));
    }
    Ok(crate::llama::Shape {
        window,
        scale,
        softcap,
        gelu,
        rotary,
        ..crate::llama::Shape::llama(hidden, heads, kv_heads, head_dim, inter, eps)
    })
}

/// A held pair of a layer's weights (`what` names them in errors).
fn held_pair(pair: PairSpec<'_>, what: [&str; 2]) -> PyResult<Option<(Held<f32>, Held<f32>)>> {
    Ok(match pair {
        Some((a, b)) => Some((Held::of(a, what[0])?, Held::of(b, what[1])?)),
        None => None,
    })
}

/// A borrowed pair of a layer's weights (`what` names them in errors).
fn pair_slices<'a>(
    pair: &'a Option<(PyReadonlyArray1<'_, f32>, PyReadonlyArray1<'_, f32>)>,
    what: [&str; 2],
) -> PyResult<Option<(&'a [f32], &'a [f32])>> {
    Ok(match pair {
        Some((a, b)) => Some((c_slice(a, what[0])?, c_slice(b, what[1])?)),
        None => None,
    })
}

#[pymethods]
impl LlamaStack {
    #[new]
    fn new(
        layers: Vec<LayerSpec<'_>>,
        norm: Bound<'_, PyArray1<f32>>,
        eps: f32,
        head: (Bound<'_, PyArray1<u8>>, u32),
        vocab: usize,
        softcap: f32,
    ) -> PyResult<Self> {
        if !(softcap.is_finite() && softcap >= 0.0) {
            return Err(PyValueError::new_err(format!(
                "LlamaStack: the logits' soft-cap is {softcap}; expected 0 (none) or a positive number"
            )));
        }
        let mut held = Vec::with_capacity(layers.len());
        for (i, (weights, attn_norm, ffn_norm, dims, (bias, norms, post))) in layers.into_iter().enumerate() {
            let mut ws = Vec::with_capacity(weights.len());
            for (j, (w, id)) in weights.into_iter().enumerate() {
                ws.push((
                    Held::of(w, &format!("LlamaStack: layer {i} weight {j}"))?,
                    qtype_of(id)?,
                ));
            }
            let attn_norm = Held::of(attn_norm, "LlamaStack: attn_norm")?;
            let ffn_norm = Held::of(ffn_norm, "LlamaStack: ffn_norm")?;
            let qkv_bias = match bias {
                Some(b) => Some(Held::of(b, &format!("LlamaStack: layer {i} qkv_bias"))?),
                None => None,
            };
            let names = |a: &str, b: &str| {
                [
                    format!("LlamaStack: layer {i} {a}"),
                    format!("LlamaStack: layer {i} {b}"),
                ]
            };
            let [q, k] = names("q_norm", "k_norm");
            let qk_norms = held_pair(norms, [&q, &k])?;
            let [a, f] = names("post_attention_norm", "post_ffw_norm");
            let post_norms = held_pair(post, [&a, &f])?;
            let shape = shape_of(attn_norm.len, dims)?;
            let layer = HeldLayer {
                weights: ws,
                attn_norm,
                ffn_norm,
                qkv_bias,
                qk_norms,
                post_norms,
                shape,
            };
            layer_weights(&layer).map_err(|e| PyValueError::new_err(format!("LlamaStack: layer {i}: {e}")))?;
            held.push(layer);
        }
        let norm = Held::of(norm, "LlamaStack: norm")?;
        let hidden = norm.len;
        if held.is_empty() || held.iter().any(|l| l.shape.hidden != hidden) {
            return Err(PyValueError::new_err(
                "LlamaStack: at least one layer, every norm of the hidden size",
            ));
        }
        let q = qtype_of(head.1)?;
        Ok(LlamaStack {
            layers: held,
            norm,
            eps,
            head: (Held::of(head.0, "LlamaStack: head")?, q),
            vocab,
            hidden,
            softcap,
        })
    }

    /// The stack over x (N, hidden) in place (see `llama::forward`):
    /// keys[s · L + l], values[s · L + l] sequence s's cache of layer l
    /// (kv_heads, capacity, head_dim), float32 or float16 (`kv.rs`),
    /// pasts[s] its filled positions, lengths[s] its rows of x; mask None
    /// (causal) or, for one sequence, (n, past + n) uint8; the logits of
    /// rows `rows`; `local` the (cos, sin) of the layers that take rotary
    /// table 1 (Gemma 3's sliding layers). Returns (logits (len(rows),
    /// vocab), the final-normed states (N, hidden)). `panels`: None, or one
    /// entry per row of `rows`: None (its whole vocabulary) or the sorted
    /// vocabulary panels (16 ids each) whose logits that row needs, the rest
    /// of its row NaN (`llama::forward`).
    #[pyo3(signature = (x, cos, sin, keys, values, pasts, lengths, mask, rows, threads, path=None, activations="f32", local=None, panels=None))]
    #[allow(clippy::too_many_arguments)]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        mut x: PyReadwriteArray2<'py, f32>,
        cos: PyReadonlyArray2<'py, f32>,
        sin: PyReadonlyArray2<'py, f32>,
        keys: Vec<Bound<'py, PyAny>>,
        values: Vec<Bound<'py, PyAny>>,
        pasts: Vec<usize>,
        lengths: Vec<usize>,
        mask: Option<PyReadonlyArray2<'py, u8>>,
        rows: Vec<usize>,
        threads: usize,
        path: Option<&str>,
        activations: &str,
        local: Option<(PyReadonlyArray2<'py, f32>, PyReadonlyArray2<'py, f32>)>,
        panels: Option<Vec<Option<Vec<usize>>>>,
    ) -> PyResult<Arrays2<'py>> {
        let (path, act) = (path_of(path)?, act_of(activations)?);
        let panels = panels.unwrap_or_default();
        let panels: Vec<Option<&[usize]>> = panels.iter().map(|p| p.as_deref()).collect();
        let (mut keys, mut values) = (
            CacheArray::all(&keys, "LlamaStack.forward: keys")?,
            CacheArray::all(&values, "LlamaStack.forward: values")?,
        );
        let (sequences, depth) = (lengths.len(), self.layers.len());
        let shapes: Vec<crate::llama::Shape> = self.layers.iter().map(|l| l.shape).collect();
        crate::llama::StepShapes {
            x: x.shape(),
            lengths: &lengths,
            pasts: pasts.len(),
            keys: keys.iter().map(|k| k.shape()).collect(),
            values: values.iter().map(|v| v.shape()).collect(),
            q8: keys.iter().map(CacheArray::q8).collect(),
            masked: mask.is_some(),
        }
        .check("LlamaStack.forward", &shapes, self.hidden)?;
        let n: usize = lengths.iter().sum();
        let stack = crate::llama::Stack {
            layers: self
                .layers
                .iter()
                .map(|l| Ok((layer_weights(l)?, l.shape)))
                .collect::<crate::Result<_>>()?,
            norm: self.norm.slice(),
            eps: self.eps,
            head: crate::llama::Weight {
                packed: self.head.0.slice(),
                q: self.head.1,
            },
            vocab: self.vocab,
            softcap: self.softcap,
        };
        let mut tables = vec![(
            c_slice(&cos, "LlamaStack.forward: cos")?,
            c_slice(&sin, "LlamaStack.forward: sin")?,
        )];
        if let Some((c, s)) = &local {
            if c.shape() != cos.shape() || s.shape() != sin.shape() {
                return Err(PyValueError::new_err(format!(
                    "LlamaStack.forward: the local rotary tables are {:?} and {:?}; expected cos's {:?}",
                    c.shape(),
                    s.shape(),
                    cos.shape()
                )));
            }
            tables.push((
                c_slice(c, "LlamaStack.forward: local cos")?,
                c_slice(s, "LlamaStack.forward: local sin")?,
            ));
        }
        let ms = match &mask {
            Some(m) => Some(c_slice(m, "LlamaStack.forward: mask")?),
            None => None,
        };
        let contiguous =
            |what: String| PyValueError::new_err(format!("LlamaStack.forward: {what} must be C-contiguous"));
        let mut caches: Vec<Vec<crate::llama::Segment>> = (0..depth).map(|_| Vec::with_capacity(sequences)).collect();
        for (i, (k, v)) in keys.iter_mut().zip(values.iter_mut()).enumerate() {
            let (seq, layer) = (i / depth, i % depth);
            let capacity = k.shape()[1];
            caches[layer].push(crate::llama::Segment {
                n: lengths[seq],
                cache: crate::llama::Cache {
                    kv: kv_of(k, v, i, "LlamaStack.forward")?,
                    capacity,
                    past: pasts[seq],
                },
                mask: ms,
            });
        }
        let xs = x.as_slice_mut().map_err(|_| contiguous("x".into()))?;
        let mut logits = vec![0.0f32; rows.len() * self.vocab];
        let mut states = vec![0.0f32; n * self.hidden];
        py.detach(|| {
            crate::llama::forward(
                xs,
                &tables,
                &mut caches,
                &stack,
                &rows,
                &panels,
                &mut logits,
                &mut states,
                threads,
                path,
                act,
            )
        })?;
        let shape = |e: numpy::ndarray::ShapeError| PyRuntimeError::new_err(format!("LlamaStack.forward: {e}"));
        Ok((
            Array2::from_shape_vec((rows.len(), self.vocab), logits)
                .map_err(shape)?
                .into_pyarray(py),
            Array2::from_shape_vec((n, self.hidden), states)
                .map_err(shape)?
                .into_pyarray(py),
        ))
    }
}

pub(super) fn layer_weights(l: &HeldLayer) -> crate::Result<crate::llama::Weights<'_>> {
    use crate::llama::{Extras, Weight, Weights};
    let packed: Vec<Weight> = l
        .weights
        .iter()
        .map(|(h, q)| Weight {
            packed: h.slice(),
            q: *q,
        })
        .collect();
    let extras = Extras {
        qkv_bias: l.qkv_bias.as_ref().map(|b| b.slice()),
        qk_norms: l.qk_norms.as_ref().map(|(q, k)| (q.slice(), k.slice())),
        post_norms: l.post_norms.as_ref().map(|(a, f)| (a.slice(), f.slice())),
    };
    Weights::of(&packed, &l.shape, l.attn_norm.slice(), l.ffn_norm.slice(), extras)
}

/// One Llama decoder layer in place on `x` (N, hidden): see `llama.rs`.
/// The N rows are the `lengths` (n_s) rows of each sequence s, one after
/// another. `cos`, `sin` (N, head_dim); `keys[s]`, `values[s]` (kv_heads,
/// capacity_s, head_dim), float32 or float16 (`kv.rs`), with `pasts[s]`
/// positions filled (this step writes the next n_s); `mask` None (causal) or, for one sequence, (n, past + n)
/// uint8; `weights` the packed (qkv, o, gate_up, down) with their ggml
/// types; `shape` (heads, kv_heads, head_dim, intermediate, eps, sliding
/// window or 0, score scale, score soft-cap or 0, GELU gate, rotary table:
/// unused here); `qkv_bias` (heads·d + 2·kv_heads·d), `qk_norms` (q norm, k
/// norm), (d,) each, and `post_norms` (post-attention, post-MLP), (hidden,)
/// each, where the architecture has them.
#[pyfunction]
#[pyo3(signature = (x, cos, sin, keys, values, pasts, lengths, mask, weights, attn_norm, ffn_norm, shape, threads, path=None, activations="f32", qkv_bias=None, qk_norms=None, post_norms=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn llama_layer(
    py: Python<'_>,
    mut x: PyReadwriteArray2<'_, f32>,
    cos: PyReadonlyArray2<'_, f32>,
    sin: PyReadonlyArray2<'_, f32>,
    keys: Vec<Bound<'_, PyAny>>,
    values: Vec<Bound<'_, PyAny>>,
    pasts: Vec<usize>,
    lengths: Vec<usize>,
    mask: Option<PyReadonlyArray2<'_, u8>>,
    weights: Vec<(PyReadonlyArray1<'_, u8>, u32)>,
    attn_norm: PyReadonlyArray1<'_, f32>,
    ffn_norm: PyReadonlyArray1<'_, f32>,
    shape: Dims,
    threads: usize,
    path: Option<&str>,
    activations: &str,
    qkv_bias: Option<PyReadonlyArray1<'_, f32>>,
    qk_norms: Option<(PyReadonlyArray1<'_, f32>, PyReadonlyArray1<'_, f32>)>,
    post_norms: Option<(PyReadonlyArray1<'_, f32>, PyReadonlyArray1<'_, f32>)>,
) -> PyResult<()> {
    let path = path_of(path)?;
    let act = act_of(activations)?;
    let (mut keys, mut values) = (
        CacheArray::all(&keys, "llama_layer: keys")?,
        CacheArray::all(&values, "llama_layer: values")?,
    );
    let s = shape_of(x.shape()[1], shape)?;
    crate::llama::StepShapes {
        x: x.shape(),
        lengths: &lengths,
        pasts: pasts.len(),
        keys: keys.iter().map(|k| k.shape()).collect(),
        values: values.iter().map(|v| v.shape()).collect(),
        q8: keys.iter().map(CacheArray::q8).collect(),
        masked: mask.is_some(),
    }
    .check("llama_layer", &[s], s.hidden)?;
    let mut packed = Vec::with_capacity(weights.len());
    for (i, (w, id)) in weights.iter().enumerate() {
        packed.push(crate::llama::Weight {
            packed: c_slice(w, &format!("llama_layer: weights[{i}]"))?,
            q: qtype_of(*id)?,
        });
    }
    let extras = crate::llama::Extras {
        qkv_bias: match &qkv_bias {
            Some(b) => Some(c_slice(b, "llama_layer: qkv_bias")?),
            None => None,
        },
        qk_norms: pair_slices(&qk_norms, ["llama_layer: q_norm", "llama_layer: k_norm"])?,
        post_norms: pair_slices(
            &post_norms,
            ["llama_layer: post_attention_norm", "llama_layer: post_ffw_norm"],
        )?,
    };
    let w = crate::llama::Weights::of(
        &packed,
        &s,
        c_slice(&attn_norm, "llama_layer: attn_norm")?,
        c_slice(&ffn_norm, "llama_layer: ffn_norm")?,
        extras,
    )?;
    let sequences = lengths.len();
    let (cs, ss) = (c_slice(&cos, "llama_layer: cos")?, c_slice(&sin, "llama_layer: sin")?);
    let ms = match &mask {
        Some(m) => Some(c_slice(m, "llama_layer: mask")?),
        None => None,
    };
    let contiguous = |what: String| PyValueError::new_err(format!("llama_layer: {what} must be C-contiguous"));
    let xs = x.as_slice_mut().map_err(|_| contiguous("x".into()))?;
    let mut segments = Vec::with_capacity(sequences);
    for (i, (k, v)) in keys.iter_mut().zip(values.iter_mut()).enumerate() {
        let capacity = k.shape()[1];
        segments.push(crate::llama::Segment {
            n: lengths[i],
            cache: crate::llama::Cache {
                kv: kv_of(k, v, i, "llama_layer")?,
                capacity,
                past: pasts[i],
            },
            mask: ms,
        });
    }
    py.detach(|| crate::llama::layer(xs, cs, ss, &mut segments, w, s, threads, path, act))?;
    Ok(())
}
