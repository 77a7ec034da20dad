"""The drafter interface: names on the command line, teacher-forced acceptance,
transformers baselines, and a new drafter plugging in with one class.
p = target, q = draft, k = γ."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import specdec_rs as sd
from specdec_rs import drafters
from specdec_rs.drafters.base import TeacherForced, by_depth, one_hot_draft
from specdec_rs.drafters.registry import REGISTRY, register
from specdec_rs.measure import acceptance_matrix, drafter_step_time
from specdec_rs.measure.hf import strategy
from specdec_rs.models import tiny_llama
from specdec_rs.processors import SamplingConfig

torch = pytest.importorskip("torch")

V = 32


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_llama(vocab_size=V, num_layers=3, seed=1, dtype=torch.float64)


@pytest.mark.parametrize(
    ("spec", "kind", "name"),
    [
        ("none", "none", None),
        ("prompt-lookup", "prompt-lookup", "prompt-lookup"),
        ("early-exit:2", "early-exit", "early-exit:2"),
        ("truncated:1", "truncated", "truncated:1"),
    ],
)
def test_specs_build_drafters(target: Any, spec: str, kind: str, name: str | None) -> None:
    entry, _ = drafters.parse_spec(spec)
    assert entry.kind == kind
    built = drafters.from_spec(spec, target)
    assert (built is None) if name is None else (built.name == name)


@pytest.mark.parametrize(
    "spec", ["", "early-exit", "early-exit:x", "prompt-lookup:3", "model:", "frob", 3]
)
def test_bad_specs_name_every_drafter(spec: Any) -> None:
    with pytest.raises(ValueError, match="early-exit:L .*prompt-lookup.*model:PATH"):
        drafters.parse_spec(spec)


def test_transformers_equivalents(target: Any) -> None:
    assert strategy(sd.PromptLookup()) == {"prompt_lookup_num_tokens": 10}
    assert strategy(sd.PromptLookup(), 4) == {"prompt_lookup_num_tokens": 4}
    assert strategy(sd.EarlyExit(target, 2), 3) == {
        "assistant_early_exit": 2,
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
    }
    truncated = drafters.from_spec("truncated:1", target)
    assert strategy(truncated) == {"assistant_model": truncated.model}


def test_by_depth_reads_position_t_plus_i() -> None:
    a = by_depth(np.array([0.1, 0.2, 0.3]), 2)
    assert a[0].tolist() == [0.1, 0.2] and a[1].tolist() == [0.2, 0.3]
    assert a[2, 0] == 0.3 and np.isnan(a[2, 1])


@register("every-other", arg=None, help="a test drafter: repeats the token two back")
class EveryOther:
    """A drafter written outside the package: one class, registered once.
    It proposes seq[-2] (one draft, one-hot q)."""

    name = "every-other"
    needs_target_hidden = False

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> EveryOther:
        return cls()

    def check_target(self, target: Any) -> None:
        pass

    def start(self, seq: Any, target_cache: Any, target_hidden: Any = None) -> None:
        pass

    def propose(self, seq: Any, k: int, sampler: Any) -> sd.Draft:
        return one_hot_draft(seq[-2:-1].clone(), sampler)

    def update(self, seq: Any, num_accepted: int, target_hidden: Any = None) -> None:
        pass

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        a = np.full((len(tf.answer), k_max), np.nan)
        seq = tf.seq.numpy()
        for t in range(len(tf.answer)):
            x = seq[tf.start + t - 2]
            a[t, 0] = float(x == seq[tf.start + t]) if tf.sampler.config.greedy else tf.p[t, x]
        return a

    def hf_kwargs(self) -> dict[str, Any] | None:
        return None


def test_a_new_drafter_plugs_in_with_one_class(target: Any) -> None:
    """Built by name, run by the loop, scored by teacher forcing, timed: no
    edit anywhere else."""
    try:
        drafter = drafters.from_spec("every-other", target)
        prompt = [4, 9, 4, 9, 4, 9, 4]
        plain = sd.generate(target, None, prompt, max_new_tokens=12, temperature=0, eos_token_id=[])
        out = sd.generate(
            target, drafter, prompt, max_new_tokens=12, temperature=0, eos_token_id=[]
        )
        assert out.tokens == plain.tokens and out.drafter == "every-other"
        a = acceptance_matrix(
            target, drafter, torch.tensor(prompt), torch.tensor(out.tokens), SamplingConfig(0), 2
        )
        two_back = ([9, 4] + out.tokens)[:12]
        expected = [float(x == y) for x, y in zip(two_back, out.tokens, strict=True)]
        assert a[:, 0].tolist() == expected and np.isnan(a[:, 1]).all()
        assert drafter_step_time(drafter, target, torch.tensor(prompt), repeats=3) > 0
        assert strategy(drafter) is None
    finally:
        del REGISTRY["every-other"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_the_row_sums_judge_every_row_as_its_float64_sum_does(dtype: str) -> None:
    """`row_sums` (the draft check's sums: float32 first on the CPU, float64
    again only near 1 ± tol or past it): over rows at 49,152 tokens that sum
    just inside and just outside the tolerance, spread thin or on a few
    entries, with a NaN or an infinity, every row passes or fails exactly as
    its float64 sum says, and a failing row reports its float64 sum."""
    from specdec_rs import _checks
    from specdec_rs.drafters.draft import row_sums

    kind = getattr(torch, dtype)
    vocab = 49_152
    tol = _checks.torch_sum_tolerance(kind, vocab)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for total in (1.0, 1 + 0.999 * tol, 1 - 0.999 * tol, 1 + 1.001 * tol, 1 - 1.001 * tol, 0.5):
        thin = torch.rand(vocab, generator=gen, dtype=torch.float64)
        rows.append(thin / thin.sum() * total)  # every entry small
        few = torch.zeros(vocab, dtype=torch.float64)
        few[:3] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64) * total
        rows.append(few)
    q = torch.stack(rows).to(kind)
    q[0, 7] = float("nan")
    q[1, 9] = float("inf")
    exact = q.sum(-1, dtype=torch.float64)
    fast = row_sums(q, tol, eager=True)
    bad = ~torch.isfinite(exact) | ((exact - 1).abs() > tol)
    judged = ~torch.isfinite(fast) | ((fast - 1).abs() > tol)
    assert torch.equal(judged, bad) and bool(bad.any()) and not bool(bad.all())
    same = {"rtol": 0.0, "atol": 0.0, "equal_nan": True}
    torch.testing.assert_close(fast[bad], exact[bad], **same)
    torch.testing.assert_close(row_sums(q, tol, eager=False), exact, **same)
