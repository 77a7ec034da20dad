"""The GGUF architectures beyond Llama (`gguf.architectures`): a tiny random
model of each, built by transformers' own class (Llama with Llama 3's rope
scaling, Qwen2, Qwen3, Phi-3, Gemma 1-3), written by the project's writer in Q4_K_M-like
types (Q4_K, Q6_K for attn_v and ffn_down, a Q8_0 embedding) and read back:
logits against transformers' forward of the dequantized twin, greedy text
against the twin's, speculation against target-only for the drafters and a
GGUF draft model, batches against lone rows; a sliding window; files that
are refused. p = target, q = draft, k = γ."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import specdec_rs as sd
from specdec_rs import models
from specdec_rs.gguf import load_gguf
from specdec_rs.gguf.writer import write_gguf
from test_gguf import _corrupt, _set_metadata, _with_k_quants

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

V = 96
ARCHITECTURES = ["llama3", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3"]
# Q4_K_M-like: Q4_K linears, Q6_K value and down projections, a Q8_0 embedding
Q4_K_M = {f"blk.{i}.{name}.weight": "Q6_K" for i in range(6) for name in ("attn_v", "ffn_down")}
# Gemma 3's sixth layer is its first global one (other rotary, no window); Gemma's windows
# hold the prompts here (tree drafters run only inside a window): `test_gemma_windows` crosses them
LAYERS = {"gemma3": 6}
WINDOWS = {"gemma2": {"sliding_window": 64}, "gemma3": {"sliding_window": 64}}


def written(model: Any, path: Path, **kw: Any) -> Any:
    """write_gguf with random valid K-quant blocks (gguf-py cannot write them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "quantize", _with_k_quants(gguf.quantize))
        return write_gguf(model, path, **kw)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(architecture, its Q4_K_M-like file, the float32 twin transformers runs)."""
    arch = request.param
    model = models.tiny_model(
        arch,
        vocab_size=V,
        hidden_size=256,
        num_layers=LAYERS.get(arch, 2),
        seed=7,
        **WINDOWS.get(arch, {}),
    )
    path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
    twin = written(model, path, linear_type="Q4_K", embed_type="Q8_0", types=Q4_K_M)
    return arch, path, twin


def gguf_draft(arch: str, target: Any, path: Path, *, seed: int) -> Any:
    """A 1-layer random model of `arch` written to `path` (Q8_0), as the
    GGUF draft model of `target` (`--drafter model:PATH.gguf`)."""
    tiny = models.tiny_model(arch, vocab_size=V, hidden_size=64, num_layers=1, seed=seed)
    write_gguf(tiny, path, linear_type="Q8_0")
    return sd.drafters.DraftModel.from_spec(str(path), target, None, False)


def prompt(seed: int, n: int = 7) -> Any:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def test_logits_match_transformers_forward_of_the_twin(
    arch_file: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    arch, path, twin = arch_file
    model, _ = load_gguf(path, tokenizer=False)
    assert "no native kernel" not in capsys.readouterr().err
    assert model.config.specdec_architecture == ("llama" if arch == "llama3" else arch)
    assert type(twin).__name__.lower().startswith(arch.rstrip("3") if arch == "llama3" else arch)
    ids = prompt(1, 11)[None]
    with torch.inference_mode():
        exact = copy.deepcopy(twin).double()(ids).logits  # the file's function, in float64
        want = twin(ids).logits
        got = model(ids).logits  # torch's operations over the kernels' products
        native = model(ids, use_cache=False).logits  # the Rust layer (`rust/llama.rs`)
    # float32 noise: 1e-4 of the largest logit, or 4x transformers' own float32 error where
    # the random K-quant blocks make a deep model ill-conditioned (Gemma 3's six layers: 1.6e-3)
    noise = float((want.double() - exact).abs().max())
    tolerance = max(1e-4 * float(exact.abs().max()), 4 * noise)
    for logits in (got, native):
        torch.testing.assert_close(logits.double(), exact, rtol=0, atol=tolerance)


def test_greedy_text_is_the_twins(arch_file: Any) -> None:
    _, path, twin = arch_file
    model, _ = load_gguf(path, tokenizer=False)
    for seed in range(2):
        ids = prompt(seed)
        want = sd.generate(twin, None, ids, max_new_tokens=32, temperature=0, eos_token_id=[])
        got = sd.generate(model, None, ids, max_new_tokens=32, temperature=0, eos_token_id=[])
        assert got.tokens == want.tokens, seed


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_speculation_is_the_targets_on_every_architecture(
    arch_file: Any, activations: str, tmp_path: Path
) -> None:
    arch, path, _ = arch_file
    model, _ = load_gguf(path, tokenizer=False, activations=activations)
    draft = gguf_draft(arch, model, tmp_path / "draft.gguf", seed=8)
    ids = torch.cat([prompt(3), prompt(3)[:4]])  # a repeat for the lookup to find
    plain = sd.generate(model, None, ids, max_new_tokens=20, temperature=0, eos_token_id=[])
    for name, drafter, kw in (
        ("prompt lookup", sd.PromptLookup(), {"k": 4}),
        ("early exit", sd.EarlyExit(model, 1), {"k": 3}),
        ("lookup tree", sd.PromptLookup(), {"tree": 6}),
        ("gguf draft model", draft, {"k": 3}),
    ):
        out = sd.generate(
            model, drafter, ids, max_new_tokens=20, temperature=0, eos_token_id=[], **kw
        )
        assert out.tokens == plain.tokens, name
        assert out.drafted > 0, name
    # a batch of prompts: each row's greedy text is its lone run's
    rows = [prompt(4), prompt(5, 9)]
    batch = sd.generate_batch(
        model, sd.PromptLookup, rows, max_new_tokens=12, k=3, temperature=0, eos_token_id=[]
    )
    assert batch.steps, "the batch ran rounds"
    for row, out in zip(rows, batch.results, strict=True):
        lone = sd.generate(model, None, row, max_new_tokens=12, temperature=0, eos_token_id=[])
        assert out is not None and out.tokens == lone.tokens


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Phi-3 of a sliding window of 8 positions: its file, its twin, and
    a file of the same weights without the window."""

    model = models.tiny_model("phi3", vocab_size=V, hidden_size=64, seed=9, sliding_window=8)
    folder = tmp_path_factory.mktemp("window")
    twin = write_gguf(model, folder / "window.gguf", linear_type="Q8_0")
    plain = copy.deepcopy(model)
    plain.config.sliding_window = None
    write_gguf(plain, folder / "plain.gguf", linear_type="Q8_0")
    return folder / "window.gguf", twin, folder / "plain.gguf"


def test_a_sliding_window_is_applied_as_transformers_does(windowed: Any) -> None:
    path, twin, plain_path = windowed
    model, _ = load_gguf(path, tokenizer=False)
    unwindowed, _ = load_gguf(plain_path, tokenizer=False)
    assert (model.config.specdec_sliding_window, unwindowed.config.specdec_sliding_window) == (8, 0)
    ids = prompt(2, 20)[None]
    with torch.inference_mode():
        want = twin(ids).logits
        got = model(ids).logits
        far = unwindowed(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    # the window changes the positions past it and none before
    torch.testing.assert_close(far[0, :8], got[0, :8], rtol=0, atol=1e-5 * float(want.abs().max()))
    assert not torch.allclose(far[0, 10:], got[0, 10:], atol=1e-2)
    # decoding past the window: speculative (chain) and target-only agree, and match the twin
    ids = torch.cat([prompt(6, 12), prompt(6, 12)[:5]])
    plain = sd.generate(model, None, ids, max_new_tokens=16, temperature=0, eos_token_id=[])
    twin_text = sd.generate(twin, None, ids, max_new_tokens=16, temperature=0, eos_token_id=[])
    assert plain.tokens == twin_text.tokens
    out = sd.generate(
        model, sd.PromptLookup(), ids, max_new_tokens=16, k=4, temperature=0, eos_token_id=[]
    )
    assert out.tokens == plain.tokens and out.drafted > 0
    # a tree past the window is refused (its rows' positions are not their places), on the
    # GGUF model and on transformers' own Phi-3 (which would take the tree's mask unwindowed:
    # a tree there gave other text than target-only before it was refused)
    for target in (model, twin):
        with pytest.raises(ValueError, match="sliding window"):
            sd.generate(
                target,
                sd.PromptLookup(),
                ids,
                max_new_tokens=8,
                tree=6,
                temperature=0,
                eos_token_id=[],
            )


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_windows_rotaries_and_soft_caps_are_transformers(arch: str, tmp_path: Path) -> None:
    """Gemma 2 and 3 with a window of 8 (their layers in llama.cpp's
    pattern), Gemma 2's soft-caps, Gemma 3's local and scaled global
    rotaries: logits past the window against transformers' own model of
    the file's values, greedy text against it, speculation (a chain
    drafter and a GGUF draft model) and batch rows against target-only."""
    layers = 6 if arch == "gemma3" else 2
    model_hf = models.tiny_model(arch, vocab_size=V, hidden_size=64, num_layers=layers, seed=11)
    path = tmp_path / f"{arch}.gguf"
    twin = write_gguf(model_hf, path, linear_type="Q8_0")
    model, _ = load_gguf(path, tokenizer=False)
    decoder = model.model.layers
    if arch == "gemma2":  # even layers slide; scores and logits capped
        assert [(x.window, x.rotary, x.softcap) for x in decoder] == [(8, 0, 50.0), (0, 0, 50.0)]
        assert model.lm_head.softcap == 30.0
    else:  # all but every sixth layer slide, on the local rotary
        assert [(x.window, x.rotary) for x in decoder] == [(8, 1)] * 5 + [(0, 0)]
    ids = prompt(12, 24)[None]
    with torch.inference_mode():
        want = twin(ids).logits
        got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    # decoding past the window: the twin's text; speculative (chain) and batch rows target-only's
    ids = torch.cat([prompt(13, 12), prompt(13, 12)[:5]])
    plain = sd.generate(model, None, ids, max_new_tokens=16, temperature=0, eos_token_id=[])
    twin_text = sd.generate(twin, None, ids, max_new_tokens=16, temperature=0, eos_token_id=[])
    assert plain.tokens == twin_text.tokens
    draft = gguf_draft(arch, model, tmp_path / "draft.gguf", seed=14)
    for name, drafter in (("prompt lookup", sd.PromptLookup()), ("gguf draft model", draft)):
        out = sd.generate(
            model, drafter, ids, max_new_tokens=16, k=3, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain.tokens and out.drafted > 0, name
    # transformers' own Gemma would take a tree's mask without the window: refused past it
    with pytest.raises(ValueError, match="sliding window of 8"):
        sd.generate(twin, sd.PromptLookup(), ids, max_new_tokens=8, tree=6, temperature=0)
    rows = [ids, prompt(15, 10)]
    batch = sd.generate_batch(
        model, sd.PromptLookup, rows, max_new_tokens=12, k=3, temperature=0, eos_token_id=[]
    )
    for row, out in zip(rows, batch.results, strict=True):
        lone = sd.generate(model, None, row, max_new_tokens=12, temperature=0, eos_token_id=[])
        assert out is not None and out.tokens == lone.tokens


def _renamed(path: Path, to: Path, old: bytes, new: bytes) -> Path:
    """A copy of the file with the first `old` (a key or tensor name) spelled `new` (as long)."""
    assert len(old) == len(new)
    return _corrupt(
        path, to, lambda b: b.__setitem__(slice(b.find(old), b.find(old) + len(old)), new)
    )


def test_other_architectures_rope_scalings_and_missing_extras_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "qwen2.gguf"
    write_gguf(models.tiny_model("qwen2", vocab_size=V, num_layers=1), path, linear_type="Q8_0")
    moe = tmp_path / "moe.gguf"  # an architecture refused with its reason
    writer = gguf.GGUFWriter(str(moe), "qwen2moe")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ValueError,
        match=r"moe.gguf.*'qwen2moe' \(mixture-of-experts.*\); this loader reads llama .*gemma3",
    ):
        load_gguf(moe, tokenizer=False)
    other = _renamed(path, tmp_path / "other.gguf", b"qwen2", b"mamba")
    with pytest.raises(
        ValueError, match=r"'mamba'; this loader reads llama \(.*qwen2 .*qwen3 .*phi3"
    ):
        load_gguf(other, tokenizer=False)
    # a bias tensor renamed: the file and the missing tensor are named
    no_bias = _renamed(path, tmp_path / "bias.gguf", b"blk.0.attn_k.bias", b"blk.0.attn_k.bixs")
    with pytest.raises(ValueError, match=r"bias.gguf.*tensor blk.0.attn_k.bias is missing"):
        load_gguf(no_bias, tokenizer=False)
    # LongRoPE factors (a 128k Phi-3)
    long = _renamed(path, tmp_path / "long.gguf", b"output_norm.weight", b"rope_factors_short")
    with pytest.raises(ValueError, match="LongRoPE"):
        load_gguf(long, tokenizer=False)


def test_a_generation_stops_where_llama_cpp_stops(tmp_path: Path) -> None:
    """The stop set of a GGUF model is llama.cpp's end-of-generation set:
    the file's eos, eot and eom ids and every token of an end's text (a
    Gemma file's eos is `<eos>` but its turns end at `<end_of_turn>`)."""
    from specdec_rs.gguf.model import end_of_generation
    from specdec_rs.gguf.reader import read

    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_token_list(["<eos>", "<end_of_turn>", "x", "<|end|>", "<|im_end|>", "y"])
    writer.add_eos_token_id(0)
    writer.add_eot_token_id(2)
    writer.add_uint32("tokenizer.ggml.eom_token_id", 99)  # past the vocabulary: left out
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file):
        step()
    writer.write_tensors_to_file()
    writer.close()
    f = read(path)
    assert end_of_generation(f, 6) == [0, 1, 2, 3, 4]
    assert end_of_generation(f, 2) == [0, 1]  # a vocabulary cut to the LM head's rows
    # SmolLM2's file: its eos <|im_end|> and <|endoftext|>, for generation's default stop
    model, _ = load_gguf(models.smollm2_gguf(), tokenizer=False)
    assert model.generation_config.eos_token_id == [0, 2]


def test_bad_gemma_metadata_is_refused_naming_the_file_and_the_key(tmp_path: Path) -> None:
    """A soft-cap or a linear rope factor that is not positive, a Gemma
    config a file cannot say: each one ValueError naming what is wrong."""
    model = models.tiny_model("gemma2", vocab_size=V, hidden_size=64, seed=5)
    path = tmp_path / "gemma2.gguf"
    write_gguf(model, path, linear_type="Q8_0")
    for key, value in (
        (b"gemma2.attn_logit_softcapping", -1.0),
        (b"gemma2.final_logit_softcapping", 0.0),
    ):
        bad = _corrupt(path, tmp_path / "cap.gguf", _set_metadata(key, value, "f32"))
        with pytest.raises(ValueError, match=rf"cap.gguf.*{key.decode()} = {value}"):
            load_gguf(bad, tokenizer=False)
    gemma3 = models.tiny_model("gemma3", vocab_size=V, hidden_size=64, seed=5)
    path = tmp_path / "gemma3.gguf"
    write_gguf(gemma3, path, linear_type="Q8_0")
    bad = _corrupt(
        path, tmp_path / "factor.gguf", _set_metadata(b"gemma3.rope.scaling.factor", -8.0, "f32")
    )
    with pytest.raises(ValueError, match=r"factor.gguf.*gemma3.rope.scaling.factor = -8.0"):
        load_gguf(bad, tokenizer=False)
    # configs whose function a file cannot hold: the writer refuses them
    odd = models.tiny_model("gemma2", vocab_size=V, hidden_size=64, query_pre_attn_scalar=100)
    with pytest.raises(ValueError, match=r"query_pre_attn_scalar 100 \(llama.cpp takes 16"):
        write_gguf(odd, tmp_path / "odd.gguf", linear_type="Q8_0")
    odd = models.tiny_model("gemma3", vocab_size=V, hidden_size=64, num_layers=2,
                            layer_types=["full_attention", "sliding_attention"])  # fmt: skip
    with pytest.raises(ValueError, match="layer_types"):
        write_gguf(odd, tmp_path / "odd.gguf", linear_type="Q8_0")


def test_the_float32_reference_is_transformers_own_class_on_the_files_values(
    arch_file: Any,
) -> None:
    """`gguf.twin.float32_twin` (`--weights float32`): the writer's twin again, read
    back from the file alone (Llama 3's rope_freqs, a Llama's unpermuted rows)."""
    from specdec_rs.gguf.twin import float32_twin

    _, path, twin = arch_file
    reference = float32_twin(path)
    assert type(reference) is type(twin)
    ids = prompt(4, 13)[None]
    with torch.inference_mode():
        want, got = twin(ids).logits, reference(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))


def gemma_vocabulary(path: Path) -> int:
    """A GGUF file holding only a Gemma-style SentencePiece tokenizer (its
    special tokens at Gemma's ids, byte fallback, a few merged pieces, a
    Gemma chat template) for a writer's `tokenizer=`; its vocabulary size."""
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    chars = ["\u2581"] + [chr(c) for c in range(33, 127)]
    pieces = ["\u2581t", "he", "\u2581the", "\u2581a", "in", "er", "\u2581d", "ef", "\u2581def"]
    tokens = special + [f"<0x{i:02X}>" for i in range(256)] + chars + pieces
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([3, 3, 3, 2, 3, 3, 3] + [6] * 256 + [1] * (len(chars) + len(pieces)))
    for add, token in ((writer.add_bos_token_id, 2), (writer.add_eos_token_id, 1)):
        add(token)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(
        "{{ bos_token }}{% for message in messages %}<start_of_turn>"
        "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
        "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(tokens)


def test_the_command_line_runs_a_gemma3_file_with_its_sentencepiece_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specdec generate --model FILE.gguf` on a Gemma 3 file: transformers'
    Gemma tokenizer from the file, its chat template, llama.cpp's stop set
    (<eos> and <end_of_turn>); speculative (a lookup) == target-only ==
    `--weights float32` (transformers' Gemma 3)."""
    import json

    from specdec_rs.cli import main
    from specdec_rs.gguf.model import tokenizer_for
    from specdec_rs.gguf.twin import float32_twin

    vocab = gemma_vocabulary(tmp_path / "vocab.gguf")
    model = models.tiny_model("gemma3", vocab_size=vocab, hidden_size=64, num_layers=2, seed=5)
    path = tmp_path / "gemma3.gguf"
    write_gguf(model, path, linear_type="Q8_0", tokenizer=tmp_path / "vocab.gguf")
    loaded, tok = load_gguf(path)
    assert type(tok).__name__ == "GemmaTokenizer" and len(tok) == vocab
    assert loaded.generation_config.eos_token_id == [1, 6]  # <eos>, <end_of_turn>
    assert float32_twin(path).generation_config.eos_token_id == [1, 6]  # --weights float32
    # Gemma's: no space put before the text, BOS added, merged pieces
    pieces = tok.convert_ids_to_tokens(tok("def the").input_ids)
    assert pieces == ["<bos>", "d", "ef", "\u2581the"]
    assert (
        tokenizer_for(path, tmp_path / "cache").apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    )
    args = ["generate", "def the def the", "--model", str(path), "--json"]
    args += ["--max-new-tokens", "10", "--temperature", "0"]
    texts = []
    for extra in (
        ["--drafter", "none"],
        ["--drafter", "prompt-lookup", "--k", "3"],
        ["--weights", "float32", "--drafter", "none"],
    ):
        assert main([*args, *extra]) == 0, extra
        texts.append(json.loads(capsys.readouterr().out)["text"])
    assert texts[1:] == texts[:1] * 2, texts


def test_the_command_line_runs_a_qwen2_file_in_every_weights_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specdec generate --model FILE.gguf` at the file's precision
    (speculative == target-only) and `--weights float32` (transformers'
    Qwen2 on the file's values), with the file's own tokenizer."""
    import json

    from specdec_rs.cli import main

    model = models.tiny_model("qwen2", vocab_size=49152, hidden_size=64, num_layers=1, seed=5)
    path = tmp_path / "qwen2.gguf"
    write_gguf(model, path, linear_type="Q8_0", tokenizer=models.smollm2_gguf())
    args = ["generate", "def f(x): return x + 1", "--model", str(path), "--json"]
    args += ["--max-new-tokens", "10", "--temperature", "0"]
    texts = {}
    for extra in (
        ["--drafter", "none"],
        ["--drafter", "prompt-lookup", "--k", "3"],
        ["--weights", "float32", "--drafter", "none"],
    ):
        assert main([*args, *extra]) == 0, extra
        texts[" ".join(extra)] = json.loads(capsys.readouterr().out)["text"]
    values = list(texts.values())
    assert values[0] == values[1], texts
    assert values[2] == values[0], texts  # the reference's greedy text is the file's
    assert main([*args, "--weights", "float32", "--activations", "q8"]) == 2
    assert "--weights float32 has float weights" in capsys.readouterr().err
    # a float16 cache: another function, its speculation (a GGUF draft too) its own greedy text
    halves = []
    for extra in (
        ["--drafter", "none"],
        ["--drafter", "prompt-lookup", "--k", "3"],
        ["--drafter", f"model:{path}", "--k", "3"],
    ):
        assert main([*args, "--cache-type", "f16", *extra]) == 0, extra
        halves.append(json.loads(capsys.readouterr().out)["text"])
    assert halves[1] == halves[0] and halves[2] == halves[0], halves
    assert main([*args, "--weights", "float32", "--cache-type", "f16"]) == 2
    assert "cache_type='f16'" in capsys.readouterr().err
