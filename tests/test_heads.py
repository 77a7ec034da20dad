"""Trained heads (EAGLE-style, Medusa) and their drafters on tiny random
models: decoding equals the unrolled training graph, greedy identity, files
that refuse another target or a corrupt body, training that resumes.
p = target, q = draft, k = γ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from heads_fixtures import tiny_data, tiny_head
from specdec_rs import drafters, heads
from specdec_rs.measure import acceptance_matrix, drafter_step_time
from specdec_rs.models import tiny_llama
from specdec_rs.processors import Sampler, SamplingConfig
from specdec_rs.training.data import load_dataset
from specdec_rs.training.train import TrainConfig, choose_draft_vocab, train_drafter

torch = pytest.importorskip("torch")

V = 48


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama(vocab_size=V, hidden_size=32, num_layers=2, seed=5)


@pytest.fixture(scope="module")
def trained(target: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("heads")
    return {
        "eagle": tiny_head(target, folder, "eagle", draft_vocab=40, depth=3),
        "medusa": tiny_head(target, folder, "medusa", draft_vocab=40, medusa_heads=3),
    }


def prompt(seed: int, n: int = 7) -> Any:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


NEW = 24


@pytest.fixture(scope="module")
def greedy_baselines(target: Any) -> list[tuple[Any, list[int]]]:
    """(prompt, target-only greedy tokens) for prompts 0..2, computed once."""
    out = []
    for seed in range(3):
        ids = prompt(seed)
        plain = sd.generate(target, None, ids, max_new_tokens=NEW, temperature=0, eos_token_id=[])
        out.append((ids, plain.tokens))
    return out


def test_decoding_equals_the_unrolled_training_graph(target: Any, trained: dict[str, Path]) -> None:
    """Depth d of `unroll` at position j is what the drafter computes for
    its d-th draft of the round whose last true position is j - d + 1."""
    head = heads.load(trained["eagle"], target, "eagle")
    assert isinstance(head, heads.EagleHead)
    seq = prompt(0, 20)
    with torch.inference_mode():
        feats = target.model(seq[None, :-1]).last_hidden_state
        outs = head.unroll(feats, seq[None], 4)
        for s in (1, 5, 12):
            pos = torch.arange(s + 1)[None]
            f, (k, v) = head.step(feats[:, : s + 1], seq[None, 1 : s + 2], pos, None)
            f = f[:, -1:]
            for d in range(1, 5):
                torch.testing.assert_close(f[0, 0], outs[d - 1][0, s + d - 1], atol=1e-5, rtol=1e-5)
                nxt = seq[None, s + d + 1 : s + d + 2]
                f, (k2, v2) = head.step(f, nxt, torch.tensor([[s + d]]), (k, v))
                k, v = torch.cat([k, k2], 2), torch.cat([v, v2], 2)


@pytest.mark.parametrize("native", [False, True], ids=["torch", "rust"])
def test_steps_into_the_heads_cache_equal_steps_after_its_past(
    target: Any, trained: dict[str, Path], native: bool
) -> None:
    """The drafter's cache written in place (a `PreallocatedLayer`: the true
    entries, a round's draft steps written after them and overwritten by the
    next round's true entries, grown past its first capacity) gives `step`'s
    outputs after the concatenated past; a write past its entries is refused.
    Both the torch step and the Rust one (`heads.native`: the same weights,
    another summation order, so within float32 rounding)."""
    from specdec_rs.heads.native import NativeEagleStep
    from specdec_rs.kv_cache import PreallocatedLayer

    head = heads.load(trained["eagle"], target, "eagle")
    assert isinstance(head, heads.EagleHead)
    step_into = NativeEagleStep.of(head) if native else head.step_into
    assert step_into is not None
    tolerance = 2e-5 if native else 1e-6
    seq = prompt(0, 90)
    with torch.inference_mode():
        feats = target.model(seq[None, :-1]).last_hidden_state
        cache = PreallocatedLayer(capacity=64)

        def both(lo: int, hi: int, f: Any, past: Any) -> tuple[Any, Any]:
            positions = torch.arange(lo, hi)[None]
            got = step_into(f, seq[None, lo + 1 : hi + 1], positions, cache, lo)
            want, (k, v) = head.step(f, seq[None, lo + 1 : hi + 1], positions, past)
            torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
            if past is None:
                return want, (k, v)
            return want, (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))

        out, true = both(0, 70, feats[:, :70], None)  # past the first capacity (64)
        f, past = out[:, -1:], true
        for i in range(3):  # a round's draft steps, after the true entries
            f, past = both(70 + i, 71 + i, f, past)
        both(70, 80, feats[:, 70:80], true)  # the next round's true entries overwrite them
        assert cache.get_seq_length() == 80 and cache._k is not None and cache._k.shape[2] >= 80
        with pytest.raises(ValueError, match="forward_into at 81: the cache holds 80"):
            step_into(f, seq[None, 82:83], torch.tensor([[81]]), cache, 81)


def test_the_native_step_keeps_the_heads_weights(target: Any, trained: dict[str, Path]) -> None:
    """The drafter steps on the Rust kernels where the head is a float32 CPU
    head: BF16 weights for a saved head (every value a bfloat16), F32 once a
    value is not one, the very values either way; a float64 head keeps its torch step."""
    from specdec_rs.heads.native import BF16, F32, NativeEagleStep

    drafter = drafters.from_spec(f"eagle:{trained['eagle']}", target)
    step = drafter._step
    assert isinstance(step, NativeEagleStep) and step.ggml_type == BF16
    head = drafter.head
    first = torch.arange(4)
    assert torch.equal(step.layer.qkv[0].dequantize_rows(first), head.layer.q_proj.weight[:4])
    assert torch.equal(step.layer.down_proj.dequantize_rows(first), head.layer.down_proj.weight[:4])
    assert torch.equal(step.fc.dequantize_rows(first), head.fc.weight[:4])
    assert drafter.with_confidence(0.5)._step is step  # shared, not rebuilt
    other = heads.load(trained["eagle"], target, "eagle")
    with torch.no_grad():
        other.fc.weight[0, 0] += 1e-6  # no longer a bfloat16
    f32 = NativeEagleStep.of(other)
    assert f32 is not None and f32.ggml_type == F32
    assert torch.equal(f32.fc.dequantize_rows(torch.arange(1)), other.fc.weight[:1])
    assert NativeEagleStep.of(other.double()) is None


def test_medusa_logits_on_the_kernels(target: Any, trained: dict[str, Path]) -> None:
    """The Medusa drafter's logits run on the kernels (`NativeMedusaLogits`:
    each block one product at the heads' own BF16 values) and equal the torch
    heads' within float32 rounding, for every count of heads and for a batch
    of features; F32 once a value is not a bfloat16; a float64 head stays in torch."""
    from specdec_rs.heads.native import BF16, F32, NativeMedusaLogits

    drafter = drafters.from_spec(f"medusa:{trained['medusa']}", target)
    native = drafter._logits
    assert isinstance(native, NativeMedusaLogits) and native.ggml_type == BF16
    heads_ = drafter.heads
    f = torch.randn(5, heads_.hidden, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        for count in (1, 2, 3):
            torch.testing.assert_close(
                native(f[0], heads=count), heads_.logits(f[0], heads=count), atol=2e-5, rtol=2e-5
            )
        torch.testing.assert_close(native(f), heads_.logits(f), atol=2e-5, rtol=2e-5)
        assert native(f).shape == (5, heads_.num_heads, len(heads_.draft_vocab))
    other = heads.load(trained["medusa"], target, "medusa")
    with torch.no_grad():
        other.blocks[1].weight[0, 0] += 1e-6
    f32 = NativeMedusaLogits.of(other)
    assert f32 is not None and f32.ggml_type == F32
    assert torch.equal(f32.blocks[1].dequantize_rows(torch.arange(1)), other.blocks[1].weight[:1])
    assert NativeMedusaLogits.of(other.double()) is None


@pytest.mark.parametrize("spec", ["eagle", "medusa", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_output_equals_target_greedy(
    target: Any,
    trained: dict[str, Path],
    greedy_baselines: list[tuple[Any, list[int]]],
    spec: str,
    k: int,
) -> None:
    path = trained["medusa" if spec == "medusa" else "eagle"]
    for greedy_draft in (False, True):
        drafter = drafters.from_spec(f"{spec}:{path}", target, greedy=greedy_draft)
        for seed, (ids, plain) in enumerate(greedy_baselines):
            out = sd.generate(
                target, drafter, ids, max_new_tokens=NEW, k=k, temperature=0, eos_token_id=[]
            )
            assert out.tokens == plain, (spec, k, seed)
            assert out.drafted > 0


@pytest.mark.parametrize("spec", ["eagle", "medusa", "hybrid"])
def test_tree_decoding_keeps_the_greedy_output(
    target: Any,
    trained: dict[str, Path],
    greedy_baselines: list[tuple[Any, list[int]]],
    spec: str,
) -> None:
    path = trained["medusa" if spec == "medusa" else "eagle"]
    drafter = drafters.from_spec(f"{spec}:{path}", target, greedy=True)
    for seed, (ids, plain) in enumerate(greedy_baselines[:2]):
        for budget in (1, 4, 8):
            out = sd.generate(
                target,
                drafter,
                ids,
                max_new_tokens=NEW,
                temperature=0,
                eos_token_id=[],
                tree=budget,
            )
            assert out.tokens == plain, (spec, budget, seed)
            assert out.policy == f"tree:{budget}"


def sampled_tree(
    target: Any, trained: dict[str, Path], budget: int, temperature: float
) -> tuple[Any, Any, Any]:
    """(the EAGLE drafter, the prompt, its first sampled tree of `budget` nodes)."""
    from specdec_rs.processors import Sampler, SamplingConfig

    drafter = drafters.from_spec(f"eagle:{trained['eagle']}", target)
    ids = prompt(3)
    sampler = Sampler(SamplingConfig(temperature), V, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, hidden = sd.runner.forward_with_hidden(
            target, ids[:-1], sd.runner.new_cache(target), keep=1
        )
    drafter.start(ids, None, hidden)
    return drafter, ids, drafter.propose_tree(ids, budget, sampler)


def test_sampled_eagle_trees_are_drawn_without_replacement(
    target: Any, trained: dict[str, Path]
) -> None:
    drafter, ids, tree = sampled_tree(target, trained, 6, 0.8)
    assert tree.children == "without_replacement" and tree.parents == [-1, -1, 0, 0, 2, 2]
    assert tree.q is not None and tree.q.shape == (7, V)
    for r, kids in ((0, [0, 1]), (1, [2, 3]), (3, [4, 5])):
        assert len({int(tree.tokens[c]) for c in kids}) == 2  # distinct siblings
        assert all(float(tree.q[r, tree.tokens[c]]) > 0 for c in kids)
    out = sd.generate(target, drafter, ids, max_new_tokens=16, temperature=0.8, seed=1, tree=6)
    assert out.new_tokens == 16 and out.drafted > 0


def test_sampled_eagle_trees_keep_the_depth_cap(target: Any, trained: dict[str, Path]) -> None:
    """A budget of 4,096 once ran 2,048 head steps a round when sampling."""
    drafter, _, tree = sampled_tree(target, trained, 4096, 0.7)
    assert tree.depth == drafter.tree_depth
    assert len(tree.tokens) == drafter.sample_width * drafter.tree_depth


def test_the_confidence_gate_refuses_trees_before_any_work(
    target: Any, trained: dict[str, Path]
) -> None:
    """--draft-confidence with --tree was once accepted and silently ignored."""
    hybrid = drafters.from_spec(f"hybrid:{trained['eagle']}", target).with_confidence(0.05)
    for drafter in (gated(target, trained, 0.05), hybrid):
        drafter.start = lambda *a: pytest.fail("the generation started")  # type: ignore[method-assign]
        with pytest.raises(ValueError, match="drafts chains only"):
            sd.generate(target, drafter, prompt(0), max_new_tokens=4, temperature=0, tree=4)
    ungated = gated(target, trained, 0.0)
    out = sd.generate(target, ungated, prompt(0), max_new_tokens=4, temperature=0, tree=4)
    assert out.new_tokens == 4


def test_training_lowers_the_loss(trained: dict[str, Path]) -> None:
    for kind, path in trained.items():
        result = heads.files.read_header(path)["info"]["result"]
        assert result["last_loss"] < result["first_loss"], (kind, result)
        assert len(result["holdout_agreement"]) == 3  # depths 1..3, heads 1..3


def test_teacher_forced_acceptance_has_the_drafters_shape(
    target: Any, trained: dict[str, Path]
) -> None:
    ids = prompt(3)
    for spec, path in (("eagle", trained["eagle"]), ("medusa", trained["medusa"])):
        drafter = drafters.from_spec(f"{spec}:{path}", target)
        for config in (SamplingConfig(0.0), SamplingConfig(0.8, top_k=10)):
            answer = torch.tensor(
                sd.generate(target, None, ids, max_new_tokens=12, temperature=0).tokens
            )
            a = acceptance_matrix(target, drafter, ids, answer, config, k_max=4)
            assert a.shape[1] == 4
            finite = a[np.isfinite(a)]
            assert finite.size and ((finite >= 0) & (finite <= 1 + 1e-9)).all()
            if spec == "medusa":  # 3 heads: no fourth draft
                assert np.isnan(a[:, 3]).all()


def test_draft_cost_probe_runs_through_the_protocol(target: Any, trained: dict[str, Path]) -> None:
    for spec in ("eagle", "medusa", "hybrid"):
        path = trained["medusa" if spec == "medusa" else "eagle"]
        drafter = drafters.from_spec(f"{spec}:{path}", target)
        assert drafter_step_time(drafter, target, prompt(4), repeats=3) > 0


def test_drafts_stay_in_the_draft_vocabulary(target: Any, trained: dict[str, Path]) -> None:
    head = heads.load(trained["eagle"], target, "eagle")
    allowed = set(head.draft_vocab.tolist())
    drafter = drafters.from_spec(f"eagle:{trained['eagle']}", target)
    out = sd.generate(
        target, drafter, prompt(5), max_new_tokens=30, k=4, temperature=1.0, seed=2, eos_token_id=[]
    )
    assert out.drafted > 0
    # q is zero outside the draft vocabulary, and every token stays reachable: over many
    # sampled runs some emitted token lies outside it (through the residual or the bonus)
    outside = set()
    for seed in range(40):
        outside |= (
            set(
                sd.generate(
                    target,
                    drafter,
                    prompt(seed),
                    max_new_tokens=8,
                    k=3,
                    temperature=1.0,
                    seed=seed,
                    eos_token_id=[],
                ).tokens
            )
            - allowed
        )
    assert outside


def test_features_gathered_round_by_round_draft_as_one_block(
    target: Any, trained: dict[str, Path]
) -> None:
    """While the head does not draft, each round's true feature is kept (not
    joined to the others every round); the next draft runs them as one block:
    the same draft, tokens and q, as the features handed over at once."""
    seq = prompt(0, 40)
    with torch.inference_mode():
        feats = target.model(seq[None, :-1]).last_hidden_state[0]  # positions 0..38
    drafts = []
    for one_by_one in (True, False):
        drafter = drafters.from_spec(f"eagle:{trained['eagle']}", target)
        drafter.start(seq[:11], None, feats[:10])
        if one_by_one:
            for j in range(10, 39):
                drafter.update(seq[: j + 1], 0, feats[j : j + 1])
        else:
            drafter.update(seq[:11], 0, feats[10:])
        sampler = Sampler(SamplingConfig(1.0), V, torch.Generator().manual_seed(0))
        drafts.append(drafter.propose(seq, 3, sampler))
    assert torch.equal(drafts[0].tokens, drafts[1].tokens) and len(drafts[0].tokens) == 3
    assert torch.equal(drafts[0].q, drafts[1].q)
    with pytest.raises(ValueError, match="skips positions"):
        drafter.update(torch.cat([seq, seq])[:45], 0, feats[:1])  # position 44, not 39


def test_a_head_refuses_another_target(trained: dict[str, Path]) -> None:
    other = tiny_llama(vocab_size=V, hidden_size=32, num_layers=2, seed=6)
    for kind in ("eagle", "medusa"):
        with pytest.raises(ValueError, match="another target"):
            drafters.from_spec(f"{kind}:{trained[kind]}", other)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_loaded_drafter_refuses_a_target_swapped_in_later(
    target: Any, trained: dict[str, Path], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The print of the target's weights is taken once per target object (not
    at every generation); another target is refused, before or after."""
    from specdec_rs.heads import files

    drafter = drafters.from_spec(f"{kind}:{trained[kind]}", target)
    other = tiny_llama(vocab_size=V, hidden_size=32, num_layers=2, seed=7)
    prints = []
    mismatch = files.target_mismatch
    monkeypatch.setattr(files, "target_mismatch", lambda *a: prints.append(1) or mismatch(*a))
    for model in (other, target, target, other):
        if model is other:
            with pytest.raises(ValueError, match="another target"):
                sd.generate(model, drafter, prompt(0), max_new_tokens=4, k=2)
        else:
            out = sd.generate(model, drafter, prompt(0), max_new_tokens=4, k=2, eos_token_id=[])
            assert out.new_tokens == 4
    assert len(prints) == 3  # other, target once, other again


def test_bad_head_files_are_refused(target: Any, trained: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        drafters.from_spec(f"eagle:{tmp_path / 'missing.safetensors'}", target)
    with pytest.raises(ValueError, match="holds a medusa head"):
        drafters.from_spec(f"eagle:{trained['medusa']}", target)
    truncated = tmp_path / "truncated.safetensors"
    body = trained["eagle"].read_bytes()
    truncated.write_bytes(body[: len(body) // 2])
    with pytest.raises(ValueError, match="corrupt|not a readable"):
        drafters.from_spec(f"eagle:{truncated}", target)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a readable"):
        drafters.from_spec(f"medusa:{garbage}", target)


def test_draft_vocabulary_out_of_range_is_refused(
    target: Any, trained: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(trained["eagle"]), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(trained["eagle"]))
    tensors["draft_vocab"] = tensors["draft_vocab"].clone()
    tensors["draft_vocab"][0] = V + 3
    bad = tmp_path / "bad-vocab.safetensors"
    save_file(tensors, str(bad), metadata=meta)
    with pytest.raises(ValueError, match="draft vocabulary ids span"):
        drafters.from_spec(f"eagle:{bad}", target)
    header = json.loads(meta["specdec"])
    header["config"]["shape"]["hidden"] = 64
    wrong = tmp_path / "wrong-shape.safetensors"
    save_file(
        load_file(str(trained["eagle"])), str(wrong), metadata={"specdec": json.dumps(header)}
    )
    with pytest.raises(ValueError, match="do not match"):
        drafters.from_spec(f"eagle:{wrong}", target)


def test_specs_with_optional_paths() -> None:
    assert drafters.parse_spec("eagle")[1] is None
    assert drafters.parse_spec("medusa:/x/y.safetensors")[1] == "/x/y.safetensors"
    for bad in ("eagle:", "hybrid:", "medusa::"):
        if bad == "medusa::":
            assert drafters.parse_spec(bad)[1] == ":"
            continue
        with pytest.raises(ValueError, match="not understood"):
            drafters.parse_spec(bad)


def test_training_resumes_from_its_checkpoint(target: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    tiny_data(target, data)
    config = TrainConfig(
        kind="medusa", epochs=4, batch_size=4, draft_vocab=40, checkpoint_every=5, medusa_heads=2
    )

    def stop_after(n: int) -> Any:
        def progress(description: str, total: int) -> Any:
            done = [0]

            def advance() -> None:
                done[0] += 1
                if done[0] == n:
                    raise KeyboardInterrupt

            return advance

        return progress

    with pytest.raises(
        KeyboardInterrupt
    ):  # interrupted at step 12: the checkpoint of step 10 stays
        train_drafter(target, data, tmp_path / "a.safetensors", config, progress=stop_after(12))
    marker = tmp_path / "a.ckpt" / "progress.json"
    assert json.loads(marker.read_text())["step"] == 10
    other = TrainConfig(kind="medusa", epochs=5, batch_size=4, draft_vocab=40, checkpoint_every=5)
    with pytest.raises(ValueError, match="other settings"):
        train_drafter(target, data, tmp_path / "a.safetensors", other)
    resumed = train_drafter(target, data, tmp_path / "a.safetensors", config)
    assert not marker.exists()  # a finished run leaves no checkpoint
    fresh = train_drafter(target, data, tmp_path / "b.safetensors", config)
    assert resumed.steps == fresh.steps
    a = heads.load(tmp_path / "a.safetensors", target, "medusa").state_dict()
    b = heads.load(tmp_path / "b.safetensors", target, "medusa").state_dict()
    for name in a:  # same seed and data: the resumed run lands where the fresh one does
        torch.testing.assert_close(a[name].float(), b[name].float(), atol=1e-2, rtol=1e-2)


def test_depth1_share_trains_depth_one_first(target: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    tiny_data(target, data)
    base: dict[str, Any] = {"kind": "eagle", "epochs": 2, "batch_size": 4, "draft_vocab": 40}
    runs = {
        "shallow": TrainConfig(depth=2, depth1_share=1.0, **base),
        "depth1": TrainConfig(depth=1, depth1_share=0.0, **base),
        "unrolled": TrainConfig(depth=2, depth1_share=0.0, **base),
    }
    weights = {}
    for name, config in runs.items():
        train_drafter(target, data, tmp_path / f"{name}.safetensors", config)
        weights[name] = heads.load(tmp_path / f"{name}.safetensors", target, "eagle").state_dict()
    for key in weights["shallow"]:  # every step at depth 1: the same steps as depth = 1
        torch.testing.assert_close(weights["shallow"][key], weights["depth1"][key])
    shallow, unrolled = weights["shallow"], weights["unrolled"]
    moved = [k for k in shallow if not torch.equal(shallow[k], unrolled[k])]
    assert moved, "the depth-2 loss changed nothing"


def test_distillation_labels_are_the_targets_distribution(
    target: Any, trained: dict[str, Path], tmp_path: Path
) -> None:
    from specdec_rs.training.train import (
        _cross_entropy,
        collate,
        draft_vocab_index,
        teacher_logits,
    )

    gen = torch.Generator().manual_seed(3)
    teacher = torch.randn(6, 9, generator=gen)
    label = torch.randint(0, 9, (6,), generator=gen)
    entropy = -(teacher.softmax(-1) * teacher.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(_cross_entropy(teacher, label, teacher), entropy)
    off = teacher + torch.randn(6, 9, generator=gen)
    assert _cross_entropy(off, label, teacher) > entropy  # minimal at q = p
    plain = torch.nn.functional.cross_entropy(teacher, label)
    torch.testing.assert_close(_cross_entropy(teacher, label, None), plain)
    with pytest.raises(ValueError, match="labels"):
        TrainConfig(labels="soft")
    # on greedy answers the teacher's argmax is the next token itself, at every offset
    data = tmp_path / "data"
    data.mkdir()
    tiny_data(target, data)
    greedy = [s for s in load_dataset(data) if s.greedy]
    batch = collate(greedy, 64)
    head = heads.load(trained["medusa"], target, "medusa")
    index = draft_vocab_index(head.draft_vocab, V)
    j = torch.arange(batch["features"].shape[1])
    for ahead in (1, 2, 3):
        width = batch["features"].shape[1] - ahead
        label = index[batch["tokens"][:, ahead + 1 :]]
        valid = (j[None, :width] + ahead + 1 < batch["lengths"][:, None]) & (label >= 0)
        valid &= j[None, :width] + ahead + 1 >= batch["prompt_len"][:, None]
        picked = teacher_logits(head, batch["features"][:, ahead : ahead + width]).argmax(-1)
        assert valid.sum() > 20
        assert torch.equal(picked[valid], label[valid])
    for kind in ("eagle", "medusa"):  # both losses run with the target's distribution
        config = TrainConfig(kind=kind, epochs=1, batch_size=4, draft_vocab=40, labels="target")
        result = train_drafter(target, data, tmp_path / f"{kind}.safetensors", config)
        assert np.isfinite(result.last_loss)


def test_own_prompts_file(target: Any, tmp_path: Path) -> None:
    from specdec_rs.prompts.training import read_prompts_file
    from specdec_rs.training.data import DataConfig, manifest

    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "Fix this:\\nx = 1"}\n\n"Plain string"\n')
    assert read_prompts_file(mine) == ["Fix this:\nx = 1", "Plain string"]
    chat = tmp_path / "chat.jsonl"
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    turns += [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    chat.write_text(json.dumps({"messages": turns}) + "\n")
    assert read_prompts_file(chat) == [turns[:3]]  # the target writes the last reply itself
    lines = tmp_path / "mine.txt"
    lines.write_text("first one\n\n  second one  \n")
    assert read_prompts_file(lines) == ["first one", "second one"]
    bad = {
        "missing.jsonl": (None, "not a file"),
        "empty.txt": ("\n\n", "holds no prompts"),
        "broken.jsonl": ('{"prompt": "a"}\n{"prompt": \n', "broken.jsonl:2: the line is not JSON"),
        "other.jsonl": ('{"text": "a"}\n', "other.jsonl:1: expected"),
        "binary.txt": (b"\xff\xfe\x00", "UTF-8"),
        "role.jsonl": (
            '{"messages": [{"role": "bot", "content": "a"}]}\n',
            "role.jsonl:1: messages",
        ),
        "reply.jsonl": (
            '{"messages": [{"role": "assistant", "content": "a"}]}\n',
            "reply.jsonl:1: the conversation has no user turn",
        ),
    }
    for name, (body, message) in bad.items():
        path = tmp_path / name
        if isinstance(body, bytes):
            path.write_bytes(body)
        elif body is not None:
            path.write_text(body)
        with pytest.raises(ValueError, match=message):
            DataConfig(prompts_file=path)  # refused before any work
    config = DataConfig(prompts_file=mine)
    assert config.prompts_file == str(mine)
    before = manifest(config, target)
    mine.write_text('"Another prompt"\n')
    assert manifest(config, target) != before  # changed file: its old shards are not reused
    assert "prompts_file" not in manifest(DataConfig(), target)["config"]  # older data folders


def test_draft_vocabulary_is_the_most_frequent_answer_tokens(target: Any, tmp_path: Path) -> None:
    tiny_data(target, tmp_path)
    seqs = load_dataset(tmp_path)
    choice = choose_draft_vocab(
        seqs, TrainConfig(vocab_sizes=(4, 8, 16), coverage=0.5), always=[V - 1]
    )
    counts = np.bincount(
        np.concatenate([s.tokens[s.prompt_len :].numpy() for s in seqs]), minlength=V
    )
    assert V - 1 in choice.ids
    assert list(choice.coverage) == [4, 8, 16]
    assert all(
        a <= b
        for a, b in zip(
            list(choice.coverage.values()), list(choice.coverage.values())[1:], strict=False
        )
    )
    top = [i for i in choice.ids if i != V - 1]
    assert counts[top].min() >= np.sort(counts)[-len(choice.ids) - 1] or len(top) < len(choice.ids)


def test_features_from_generation_equal_a_teacher_forced_pass(target: Any, tmp_path: Path) -> None:
    tiny_data(target, tmp_path)
    for s in load_dataset(tmp_path):
        with torch.inference_mode():
            h = target.model(s.tokens[None, :-1]).last_hidden_state[0]
        torch.testing.assert_close(s.features.float(), h, atol=2e-3, rtol=2e-3)  # stored as float16


def test_one_process_keeps_the_requested_device() -> None:
    """`process_device` changes "cuda" only under `accelerate launch` with
    several processes (each then takes its own GPU)."""
    from specdec_rs.training import process_device

    assert process_device("cuda") == "cuda" and process_device("cpu") == "cpu"


def test_per_source_policy_gives_each_part_its_own_k(
    target: Any, trained: dict[str, Path], greedy_baselines: list[tuple[Any, list[int]]]
) -> None:
    """With BySource, the hybrid's lookup rounds ask for the lookup policy's k
    and its head rounds for the head's; the source is read before each round
    (as propose decides it), and the greedy output is the target's."""
    drafter = drafters.from_spec(f"hybrid:{trained['eagle']}", target)
    assert set(drafter.parts) == {"lookup", "eagle"}
    asked: list[tuple[str, int]] = []

    class Asked(sd.FixedK):
        """FixedK that logs (its source, k) each time a round asks it."""

        def __init__(self, k: int, source: str):
            super().__init__(k)
            self.source = source

        def next_k(self) -> int:
            asked.append((self.source, self.k))
            return self.k

    policy = sd.BySource({"lookup": Asked(5, "lookup"), "eagle": Asked(2, "eagle")})
    sources: list[str] = []
    propose = drafter.propose

    def spy(seq: Any, k: int, sampler: Any) -> Any:
        draft = propose(seq, k, sampler)
        sources.append(drafter.last_source)
        return draft

    drafter.propose = spy
    for ids, plain in greedy_baselines:
        asked.clear()
        sources.clear()
        out = sd.generate(
            target, drafter, ids, max_new_tokens=NEW, k=policy, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain
        assert out.policy == "by-source(lookup: fixed:5, eagle: fixed:2)"
        # every round's k came from the policy of the part that then drafted it (a
        # last round with one token left drafts nothing)
        assert [s for s, _ in asked][: len(sources)] == sources
        assert len(asked) - len(sources) in (0, 1)
        assert all(k == (5 if s == "lookup" else 2) for s, k in asked)
        assert "eagle" in sources
    # the repeating prompt makes lookup draft some rounds
    ids = torch.tensor([3, 9, 4, 3, 9, 4, 3, 9, 4, 3, 9])
    asked.clear()
    sources.clear()
    sd.generate(target, drafter, ids, max_new_tokens=NEW, k=policy, temperature=0, eos_token_id=[])
    assert "lookup" in sources and [s for s, _ in asked][: len(sources)] == sources


def test_per_source_policy_errors(target: Any, trained: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="non-empty mapping"):
        sd.BySource({})
    with pytest.raises(ValueError, match="k is drafts per round"):
        sd.BySource({"lookup": "many"})
    policy = sd.BySource({"lookup": sd.FixedK(3)})
    with pytest.raises(ValueError, match="named source 'eagle'"):
        policy.use("eagle")
    lookup = drafters.from_spec("prompt-lookup", target)
    with pytest.raises(ValueError, match="has no source"):
        sd.generate(target, lookup, prompt(0), max_new_tokens=4, k=policy, temperature=0)
    hybrid = drafters.from_spec(f"hybrid:{trained['eagle']}", target)
    with pytest.raises(ValueError, match="named source 'eagle'"):
        sd.generate(target, hybrid, prompt(0), max_new_tokens=4, k=policy, temperature=0)
    # before any work: a source without a policy once failed only mid-generation
    hybrid.start = lambda *a: pytest.fail("the generation started")  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="named source 'eagle'"):
        sd.generate(target, hybrid, prompt(0), max_new_tokens=4, k=policy, temperature=0)


def test_costs_time_each_part_of_a_hybrid(target: Any, trained: dict[str, Path]) -> None:
    from specdec_rs.measure import measure_costs

    hybrid = drafters.from_spec(f"hybrid:{trained['eagle']}", target)
    costs = measure_costs(
        target, prompt(4, 12), {"hybrid": hybrid, "none": None}, k_max=2, repeats=2
    )
    assert set(costs.cost_ratio) == {"hybrid"} and set(costs.part_cost_ratio) == {"hybrid"}
    assert set(costs.part_cost_ratio["hybrid"]) == {"lookup", "eagle"}  # keyed (spec, part)
    assert all(
        c > 0 for c in [*costs.cost_ratio.values(), *costs.part_cost_ratio["hybrid"].values()]
    )


def gated(target: Any, trained: dict[str, Path], confidence: float, greedy: bool = False) -> Any:
    plain = drafters.from_spec(f"eagle:{trained['eagle']}", target)
    return drafters.Eagle(plain.head, plain.fingerprint, greedy=greedy, confidence=confidence)


def test_confidence_gate_keeps_the_greedy_output_and_drafts_less(
    target: Any, trained: dict[str, Path], greedy_baselines: list[tuple[Any, list[int]]]
) -> None:
    drafted = {}  # the tiny head's draft probabilities lie around 0.04-0.08
    hybrid = drafters.from_spec(f"hybrid:{trained['eagle']}", target)
    for confidence in (0.0, 0.05, 0.06):
        drafted[confidence] = 0
        for greedy_draft in (False, True):
            drafter = gated(target, trained, confidence, greedy_draft)
            for ids, plain in greedy_baselines[:2]:
                out = sd.generate(
                    target, drafter, ids, max_new_tokens=NEW, k=3, temperature=0, eos_token_id=[]
                )
                assert out.tokens == plain, (confidence, greedy_draft)
                drafted[confidence] += out.drafted
    assert drafted[0.0] > drafted[0.05] > drafted[0.06] > 0, drafted
    # the hybrid gates its head rounds the same way
    for confidence in (0.05, 0.06):
        head_rounds = drafters.gated(hybrid, confidence)
        assert (
            head_rounds.eagle.confidence == confidence
            and head_rounds.eagle.head is hybrid.eagle.head
        )
        ids, plain = greedy_baselines[2]
        out = sd.generate(
            target, head_rounds, ids, max_new_tokens=NEW, k=3, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain
    assert drafters.gated(hybrid, 0.0) is hybrid


def test_confidence_gate_hands_back_the_gated_q(target: Any, trained: dict[str, Path]) -> None:
    """Sampled drafts behind a gate τ: the same draw as without the gate, kept
    iff q(x) > τ, and a kept draft's row is q' = q·1[q > τ] / Q."""
    from specdec_rs.processors import Sampler

    tau = 0.03  # the tiny head's draft probabilities lie around 0.01-0.08
    ungated, gate = gated(target, trained, 0.0), gated(target, trained, tau)
    config = SamplingConfig(1.0)
    stops = kept = 0
    for seed in range(60):
        ids = prompt(seed)
        with torch.inference_mode():
            _, h = sd.runner.forward_with_hidden(
                target, ids[:-1], sd.runner.new_cache(target), keep=1, hidden=True
            )
        rows = {}
        for name, d in (("plain", ungated), ("gated", gate)):
            d.start(ids, None, h)
            sampler = Sampler(config, V, torch.Generator().manual_seed(seed))
            rows[name] = d.propose(ids, 1, sampler)
        plain, got = rows["plain"], rows["gated"]
        if len(got.tokens) == 0:  # the same draw, at most τ: stopped
            stops += 1
            assert float(plain.q[0, plain.tokens[0]]) <= tau
            continue
        kept += 1
        assert got.tokens.tolist() == plain.tokens.tolist()  # the same draw, kept
        q = plain.q[0]
        expect = q * (q > tau)
        torch.testing.assert_close(got.q[0], expect / expect.sum())
    assert stops and kept, (stops, kept)


def test_confidence_gate_in_teacher_forcing(target: Any, trained: dict[str, Path]) -> None:
    ids = prompt(3)
    answer = torch.tensor(sd.generate(target, None, ids, max_new_tokens=12, temperature=0).tokens)
    greedy = SamplingConfig(0.0)
    plain = acceptance_matrix(target, gated(target, trained, 0.0), ids, answer, greedy, k_max=3)
    gate = acceptance_matrix(target, gated(target, trained, 0.05), ids, answer, greedy, k_max=3)
    # a gated round drafts a prefix of the ungated one: equal where drafted, then NaN
    drafted = ~np.isnan(gate)
    assert (drafted[:, 1:] <= drafted[:, :-1]).all()
    assert 0 < drafted.sum() < (~np.isnan(plain)).sum()
    np.testing.assert_array_equal(gate[drafted], plain[drafted])
    sampled = SamplingConfig(1.0)
    plain = acceptance_matrix(target, gated(target, trained, 0.0), ids, answer, sampled, k_max=2)
    gate = acceptance_matrix(target, gated(target, trained, 0.05), ids, answer, sampled, k_max=2)
    # the gate folds into the score (Q·Σ min(p, q')), drafts stay where they were
    np.testing.assert_array_equal(np.isnan(gate), np.isnan(plain))
    finite = gate[np.isfinite(gate)]
    assert ((finite >= 0) & (finite <= 1 + 1e-9)).all()
    assert (gate[np.isfinite(gate)] != plain[np.isfinite(plain)]).any()


def test_confidence_gate_rejects_bad_values(target: Any, trained: dict[str, Path]) -> None:
    for bad in (-0.1, 1.0, float("nan"), "high"):
        with pytest.raises(ValueError, match="confidence"):
            gated(target, trained, bad)  # type: ignore[arg-type]
