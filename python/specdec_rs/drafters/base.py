"""What every drafter shares: the proposal type, the protocol the loop and
the analysis call, and the teacher-forced view of a target's answer.
p = target, q = draft, k = γ.

A drafter is an object with these members (`generate` calls the first five,
`measure` the rest; nothing outside `drafters` asks what class it is):

- ``name``: its command-line spec, e.g. ``"early-exit:24"``.
- ``check_target(target)``: ValueError unless it can draft for this target.
- ``start(seq, target_cache, target_hidden)``: a new generation; `seq` (n,)
  holds the prompt; `target_hidden` is the target's last hidden state of
  the prompt's positions but the last, (n - 1, H), when the drafter sets
  ``needs_target_hidden`` (else None).
- ``propose(seq, k, sampler) -> Draft``: up to k tokens continuing `seq` and
  the rows q they were drawn from. The last token of `seq` is not yet in any
  cache (the target runs it together with the drafts).
- ``update(seq, num_accepted, target_hidden)``: the round on `seq` kept
  `num_accepted` drafts; drop any state past seq + those drafts.
  `target_hidden` (num_accepted + 1, H): the verification forward's last
  hidden states of the positions kept (seq's last token and the kept drafts),
  when ``needs_target_hidden``; no extra target pass is ever run for them.
  Under a grammar the round's drafts may not all be the drafter's: a round
  the grammar forced (``propose`` was not called) or the grammar's forced
  tail after the drafter's drafts; `num_accepted` then counts those too,
  and seq + its first `num_accepted` drafts is the text to follow.
- ``acceptance(tf, k_max) -> a (n, k_max)``: teacher forcing. a[t, i] is the
  probability that draft i + 1 of a round starting at answer position t is
  kept given the drafts before it were (NaN where no such draft exists).
- ``hf_kwargs()``: the keywords of transformers' ``generate`` for the same
  kind of drafting (the side-by-side baseline), or None when it has none.
- ``propose_tree(seq, budget, sampler) -> TreeDraft`` (optional; drafters
  with it can run ``generate(..., tree=budget)``): a tree of at most
  `budget` draft nodes continuing `seq`, verified by `verify_tree`; `update`
  then gets the kept path's length and hidden states as after a chain.
- ``check_tree()`` (optional): ValueError, before any work, when the
  drafter as configured cannot draft trees (a confidence-gated head).
- ``with_confidence(τ) -> drafter`` (optional; the EAGLE head and the
  hybrid): the same drafter behind a confidence gate, drafting each round only
  while its draft's probability exceeds τ (`gated`).
- ``fresh() -> drafter`` (optional): a drafter of the same configuration,
  its weights shared, with no generation state: the batch engine takes one
  per row (`copies`). Without it a shallow copy serves, which is right for
  a drafter whose ``start`` replaces all of its state (every built-in one
  but the hybrid, whose parts are objects of their own: it has ``fresh``).
- ``end(seq)`` (optional): called once when a generation ends by its budget
  or an EOS, with the whole sequence (a drafter that learns across sequences,
  e.g. the suffix drafter, reads the last round's tokens there).
- ``observe_window(logits)`` (needed by a drafter whose proposals carry a
  `Window`, lookahead's Jacobi window): the target's logits (r, V) at the
  window nodes it reads, from the round's verification forward, before
  ``update``. ``window_positions`` (optional int): the positions a window
  adds to each drafting round's forward, for the cost models (v(n + E)).
- ``source(seq) -> str`` and ``parts`` (optional; drafters that mix several,
  e.g. the hybrid): the name of the part that drafts the next round after
  `seq`, and each part (a drafter) by that name. A per-source γ policy
  (`policy.BySource`) follows `source`; the cost measurements time each part.

Exactness needs only that each draft was drawn from the q row handed back:
sampled drafters return their processed distribution, greedy ones a one-hot
row (also exact under sampling: a one-hot q accepts x with probability p(x)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from specdec_rs import runner
from specdec_rs.drafters.draft import Draft, TreeDraft
from specdec_rs.processors import Sampler, one_hot

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache


def fixed_tree(tokens: list[int], parents: list[int], sampler: Sampler) -> TreeDraft:
    import torch

    return TreeDraft(
        torch.tensor(tokens, dtype=torch.long, device=sampler.device), parents, None, "fixed"
    )


@dataclass(frozen=True)
class TeacherForced:
    """A target's own answer, scored once: what a drafter needs to say how
    often its drafts would pass without running a generation.

    seq: (n,) prompt + answer on the CPU; start: len(prompt).
    p: (n - start, V) processed target rows; row t predicts seq[start + t].
    sampler: the processing the target rows had (apply it to q alike).
    target: the target model; hidden: (n, H) its last hidden states.
    """

    seq: torch.Tensor
    start: int
    p: torch.Tensor
    sampler: Sampler
    target: Any
    hidden: torch.Tensor | None = None

    @property
    def answer(self) -> torch.Tensor:
        return self.seq[self.start :]

    def shifted(self, i: int) -> TeacherForced:
        """The same answer starting i tokens later (p row t is then answer[t + i])."""
        from dataclasses import replace

        return replace(self, start=self.start + i, p=self.p[i:])


class Drafter(Protocol):
    name: str
    needs_target_hidden: bool

    def check_target(self, target: PreTrainedModel) -> None: ...

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None
    ) -> None: ...

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft: ...

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None
    ) -> None: ...

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray: ...

    def hf_kwargs(self) -> dict[str, Any] | None: ...


def started(cache: Cache | None, name: str) -> Cache:
    """The drafter's cache, or a ValueError when start() was not called."""
    if cache is None:
        raise ValueError(f"drafter {name}: call start() before propose() or update()")
    return cache


def gated(drafter: Any, confidence: float) -> Any:
    """`drafter` behind a confidence gate τ (its ``with_confidence``);
    τ = 0 returns it unchanged. ValueError for a drafter without a gate."""
    from specdec_rs import _checks

    confidence = _checks.real(confidence, "confidence", minimum=0.0, below=1.0)
    if confidence == 0.0:
        return drafter
    gate = getattr(drafter, "with_confidence", None)
    if not callable(gate):
        raise ValueError(
            f"drafter {getattr(drafter, 'name', drafter)!r} has no confidence gate; "
            "use eagle or hybrid, or leave the confidence at 0"
        )
    return gate(confidence)


@dataclass(frozen=True)
class Members:
    """A drafter's optional members, found once when it is bound (None: it
    has none). wants_hidden: it reads the target's hidden states
    (`needs_target_hidden`); propose_tree(seq, budget, sampler) drafts
    trees, check_tree() refuses tree rounds it is not configured for;
    observe_window(logits) reads a window's rows (lookahead); end(seq) reads
    the whole output once; catch_up(seq) says what it must run before its
    first draft (a draft model); source(seq) names the part that drafts next
    and `parts` the parts by name (the hybrid); fresh() a like drafter for
    another row."""

    wants_hidden: bool = False
    propose_tree: Callable[..., Any] | None = None
    check_tree: Callable[[], Any] | None = None
    observe_window: Callable[[Any], Any] | None = None
    end: Callable[[Any], Any] | None = None
    catch_up: Callable[[Any], int] | None = None
    source: Callable[[Any], Any] | None = None
    parts: dict[str, Any] | None = None
    fresh: Callable[[], Any] | None = None

    @classmethod
    def of(cls, drafter: Any) -> Members:
        """`drafter`'s optional members (all None for None)."""
        if drafter is None:
            return cls()

        def member(name: str) -> Any:
            found = getattr(drafter, name, None)
            return found if callable(found) else None

        parts = getattr(drafter, "parts", None)
        return cls(
            wants_hidden=bool(getattr(drafter, "needs_target_hidden", False)),
            propose_tree=member("propose_tree"),
            check_tree=member("check_tree"),
            observe_window=member("observe_window"),
            end=member("end"),
            catch_up=member("catch_up"),
            source=member("source"),
            parts=parts if isinstance(parts, dict) else None,
            fresh=member("fresh"),
        )


def copies(drafter: Any) -> Callable[[], Any]:
    """A factory of drafters like `drafter` for the rows of a batch: the
    first call returns `drafter` itself, each later one its ``fresh()`` (or
    a shallow copy; see the module docs)."""
    import copy

    spare = [drafter]

    def make() -> Any:
        if spare:
            return spare.pop()
        fresh = Members.of(drafter).fresh
        return fresh() if fresh is not None else copy.copy(drafter)

    return make


def empty_draft(sampler: Sampler) -> Draft:
    import torch

    return Draft(
        torch.zeros(0, dtype=torch.long, device=sampler.device),
        torch.zeros(0, sampler.vocab_size, device=sampler.device),
    )


def one_hot_draft(tokens: torch.Tensor, sampler: Sampler) -> Draft:
    """Deterministic proposals: q is one-hot on each."""
    tokens = tokens.to(sampler.device)
    return Draft(tokens, one_hot(tokens, sampler.vocab_size))


def draft_autoregressive(
    model: PreTrainedModel,
    cache: Cache,
    feed: torch.Tensor,
    k: int,
    sampler: Sampler,
    greedy: bool,
) -> Draft:
    """k tokens from `model`, one forward each: feed (m,) first, then each draft
    but the last (which is never needed). The cache grows by m + k - 1."""
    import torch

    if k == 0:
        return empty_draft(sampler)
    tokens, rows = [], []
    feed = feed.to(sampler.device)
    for _ in range(k):
        q = sampler.probs(runner.forward(model, feed, cache, keep=1))
        token, q = sampler.draw(q, greedy=greedy)
        tokens.append(token)
        rows.append(q)
        feed = token
    return Draft(torch.cat(tokens), torch.cat(rows))


class ChainScores:
    """a(t, i) (len(answer), k_max) of deterministic chains under teacher
    forcing, filled one round start at a time (`score`): the indicator
    x_i = answer[t + i] at greedy, else p_{t+i}(x_i) (one-hot q); NaN
    where no draft was scored."""

    def __init__(self, tf: TeacherForced, k_max: int):
        self.answer = tf.seq[tf.start :].cpu().numpy()
        self.p = tf.p.double().cpu().numpy()
        self.greedy = tf.sampler.config.greedy
        self.n = len(self.answer)
        self.a = np.full((self.n, k_max), np.nan)

    def score(self, t: int, draft: Any) -> None:
        """Row t: the chain `draft` drafted at answer position t (cut at the answer's end)."""
        x = np.asarray(draft, dtype=np.int64)[: self.n - t]
        rows = t + np.arange(len(x))
        self.a[t, : len(x)] = (x == self.answer[rows]) if self.greedy else self.p[rows, x]


def by_depth(agree: np.ndarray, k_max: int) -> np.ndarray:
    """a[t, i] = agree[t + i]: draft i + 1 of a round at t is scored at
    position t + i under teacher forcing; NaN past the answer's end."""
    n = len(agree)
    a = np.full((n, k_max), np.nan)
    for i in range(min(k_max, n)):
        a[: n - i, i] = agree[i:]
    return a


class ModelDrafter:
    """Shared behaviour of drafters that run a causal LM (`scorer`) one token
    at a time: teacher-forced acceptance from one forward of that LM over the
    answer (at greedy the argmax agreement; otherwise Σ min(p, q) of the
    processed rows), and `greedy` drafting with a one-hot q."""

    name: str
    greedy: bool
    needs_target_hidden = False

    @property
    def scorer(self) -> PreTrainedModel:
        raise NotImplementedError

    def score(self, tf: TeacherForced) -> torch.Tensor:
        """q rows under teacher forcing: (n - start, V), row t predicting answer[t]."""
        import torch

        with torch.inference_mode():
            logits = runner.forward(
                self.scorer,
                tf.seq[:-1].to(tf.p.device),
                runner.new_cache(self.scorer),
                keep=len(tf.answer),
            )
        return tf.sampler.probs(logits)

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        import torch

        q = self.score(tf)
        if tf.sampler.config.greedy or self.greedy:
            agree = (tf.p.argmax(-1) == q.argmax(-1)).double()
            if not tf.sampler.config.greedy:  # greedy drafts, sampled target: a = p(argmax q)
                agree = tf.p.gather(-1, q.argmax(-1, keepdim=True))[:, 0].double()
        else:
            agree = torch.minimum(tf.p, q).sum(-1).double()
        return by_depth(agree.cpu().numpy(), k_max)
