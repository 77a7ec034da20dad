"""The EAGLE-style drafter: a trained head over the target's last hidden
states drafts k tokens, one head step each. p = target, q = draft, k = γ.

q is the head's processed distribution over its draft vocabulary D, zero
outside D. That is still exact: a token outside D is never drafted, and the
residual norm(max(0, p - q)) keeps every token reachable. Greedy mode drafts
the argmax with a one-hot q.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from specdec_rs import _checks
from specdec_rs.drafters.base import TeacherForced, empty_draft, fixed_tree
from specdec_rs.drafters.draft import Draft, TreeDraft
from specdec_rs.drafters.registry import register
from specdec_rs.drafters.trained import (
    HeadTarget,
    gate_passes,
    gated_rows,
    teacher_forced_acceptance,
)
from specdec_rs.processors import Sampler
from specdec_rs.trees import confident_tree

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache

    from specdec_rs.heads import EagleHead, TargetPrint


@register(
    "eagle", arg="optional-path", help="the trained EAGLE-style head (the shipped one, or PATH)"
)
class Eagle:
    """Its cache holds the head's entries of true features: entry j read
    (f_j, e(x_{j+1})). `update` hands over the verification forward's
    features of the kept positions; the next `propose` runs them as one step,
    then drafts on its own predictions and drops those entries again."""

    needs_target_hidden = True

    def __init__(
        self,
        head: EagleHead,
        fingerprint: TargetPrint | str,
        *,
        greedy: bool = False,
        name: str = "eagle",
        confidence: float = 0.0,
    ):
        self.head = head
        self.fingerprint = fingerprint
        self.greedy = _checks.boolean(greedy, "greedy")
        self.confidence = _checks.real(
            confidence, "confidence", minimum=0.0, below=1.0, hint=" (0 turns the gate off)"
        )
        from specdec_rs.heads.native import NativeEagleStep
        from specdec_rs.kv_cache import PreallocatedLayer

        self.name = name
        # the head's step on the Rust kernels where it can run there, else its torch step
        self._step = NativeEagleStep.of(head) or head.step_into
        self._target_check = HeadTarget(self.head, fingerprint, name)
        # the head's keys and values, written in place: the true positions',
        # then a round's draft steps' (overwritten by the next round's)
        self._cache = PreallocatedLayer()
        # true features of positions cached, cached + 1, ... (run at the next
        # draft; joined there once, not at every round: a head switched off
        # for a long output would copy them all at each round)
        self._pending: list[torch.Tensor] = []
        self._pending_rows = 0
        self._cached = 0
        self._last: torch.Tensor | None = None  # f̂ after the last true entry

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> Eagle:
        """``eagle`` (the shipped head) or ``eagle:PATH``."""
        from specdec_rs import heads

        path = arg or heads.shipped("eagle")
        head = cast("EagleHead", heads.load(path, target, "eagle"))
        return cls(
            head,
            heads.TargetPrint.of(target),
            greedy=greedy,
            name="eagle" if arg is None else f"eagle:{arg}",
        )

    def check_target(self, target: PreTrainedModel) -> None:
        self._target_check.check(target)

    def with_confidence(self, confidence: float) -> Eagle:
        """The same head (shared, not copied) behind a confidence gate τ:
        each round drafts while its draft's probability exceeds τ (see
        `gated_rows`; 0 turns the gate off)."""
        gated = Eagle(
            self.head, self.fingerprint, greedy=self.greedy, name=self.name, confidence=confidence
        )
        gated._step = self._step
        return gated

    def check_tree(self) -> None:
        """ValueError when this drafter cannot draft trees as configured: the
        confidence gate drafts chains only (a tree already ranks its
        candidates by the head's confidence, EAGLE-2's reranking)."""
        if self.confidence > 0.0:
            raise ValueError(
                f"drafter {self.name}: the confidence gate (τ = {self.confidence:g}) drafts "
                "chains only, and a tree already ranks its candidates by the head's "
                "confidence; use the tree without the gate, or the gate without the tree"
            )

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None
    ) -> None:
        if target_hidden is None:
            raise ValueError(f"drafter {self.name} needs the target's hidden states")
        self._cached, self._last = 0, None  # the cache is written over from position 0
        self._pending, self._pending_rows = [target_hidden], len(target_hidden)

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None
    ) -> None:
        if target_hidden is None:
            raise ValueError(f"drafter {self.name} needs the target's hidden states")
        position = len(seq) - 1  # target_hidden[0] is the feature there
        if position < self._cached:
            self._crop(position)
            self._pending, self._pending_rows = [target_hidden], len(target_hidden)
        elif position == self._cached + self._pending_rows:
            self._pending.append(target_hidden)
            self._pending_rows += len(target_hidden)
        else:
            raise ValueError(
                f"drafter {self.name}: update() at position {position} skips positions; "
                "call start()"
            )

    def _crop(self, length: int) -> None:
        self._cached, self._last = length, None  # entries past it are overwritten

    def _advance(self, seq: torch.Tensor) -> torch.Tensor:
        """Run the pending true features; f̂ (1, 1, H) after position len(seq) - 2."""
        import torch

        if self._pending_rows:
            pending = self._pending[0] if len(self._pending) == 1 else torch.cat(self._pending)
            n = len(pending)
            start = self._cached
            tokens = seq[start + 1 : start + 1 + n].to(pending.device)
            positions = torch.arange(start, start + n, device=pending.device)[None]
            out = self._step(pending[None], tokens[None], positions, self._cache, start)
            self._cached, self._last = start + n, out[:, -1:]
            self._pending, self._pending_rows = [], 0
        if self._last is None or self._cached != len(seq) - 1:
            raise ValueError(
                f"drafter {self.name}: propose() on a sequence the head has not been updated for"
            )
        return self._last

    def _draft_step(self, f: torch.Tensor, token: torch.Tensor, i: int) -> torch.Tensor:
        """One head step on the round's i-th draft `token` (1,) after f̂ `f`:
        the next f̂ (its keys and values written at cached + i, after the
        round's earlier steps')."""
        import torch

        at = self._cached + i
        position = torch.tensor([[at]], device=f.device)
        return self._step(f, token[None], position, self._cache, at)

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        import torch

        if k == 0 or len(seq) < 2:  # the head needs one feature and the token after it
            return empty_draft(sampler)
        with torch.inference_mode():
            f = self._advance(seq)
            tokens, rows = [], []
            for i in range(k):
                drawn = gated_rows(
                    self.head.logits(f[0]),
                    self.head.draft_vocab,
                    sampler,
                    self.greedy,
                    self.name,
                    self.confidence,
                )
                if drawn is None:
                    break  # not confident enough: the target takes it from here
                tokens.append(drawn[0])
                rows.append(drawn[1])
                if i + 1 < k:
                    f = self._draft_step(f, drawn[0], i)
        if not tokens:
            return empty_draft(sampler)
        return Draft(torch.cat(tokens), torch.cat(rows))

    tree_width = 4  # candidates per depth in propose_tree
    tree_depth = 6  # head steps at most per tree

    def propose_tree(self, seq: torch.Tensor, budget: int, sampler: Sampler) -> TreeDraft:
        """An EAGLE-2 style tree: the head drafts its greedy chain, keeping at
        each depth its tree_width best tokens and their probabilities (its
        confidence, softmax over the draft vocabulary); the `budget` most
        confident candidates (a candidate's confidence: the product along the
        chain above it times its own) form the tree. The chain stops once no
        deeper candidate could make the cut. Deterministic candidates: fixed
        children, exact at any temperature. When sampling (not greedy) the
        tree is drawn instead (see `_sampled_tree`)."""
        import torch

        self.check_tree()
        if budget == 0 or len(seq) < 2:
            return fixed_tree([], [], sampler)
        if not (self.greedy or sampler.config.greedy):
            return self._sampled_tree(seq, budget, sampler)
        ranked: list[tuple[list[int], list[float]]] = []
        cut: list[float] = []  # confidences so far
        above = 1.0
        with torch.inference_mode():
            f = self._advance(seq)
            for i in range(min(budget, self.tree_depth)):
                probs = self.head.logits(f[0])[0].float().softmax(-1)
                top = probs.topk(min(self.tree_width, len(probs)))
                tokens = self.head.draft_vocab[top.indices]
                ranked.append(([int(t) for t in tokens], [float(x) for x in top.values]))
                cut = sorted(cut + [above * x for x in ranked[-1][1]], reverse=True)[:budget]
                above *= ranked[-1][1][0]
                if len(cut) == budget and above <= cut[-1]:
                    break  # nothing deeper can make the cut
                f = self._draft_step(f, tokens[:1], i)
        return fixed_tree(*confident_tree(ranked, budget), sampler)

    sample_width = 2  # children per chain node in a sampled tree

    def _sampled_tree(self, seq: torch.Tensor, budget: int, sampler: Sampler) -> TreeDraft:
        """A drawn tree for sampling: at each of min(budget // sample_width,
        tree_depth) depths (head steps, capped as the greedy tree's are),
        sample_width children drawn without replacement from the head's
        processed distribution q at the chain node (recursive rejection
        sampling verifies them: children="without_replacement"); the first
        child continues the chain. q row r is the distribution the children
        of row r came from (zero rows for leaves, which have none)."""
        import torch

        width = min(self.sample_width, budget)
        depth = min(budget // width, self.tree_depth)
        tokens: list[torch.Tensor] = []
        parents: list[int] = []
        rows: dict[int, torch.Tensor] = {}
        parent = -1
        with torch.inference_mode():
            f = self._advance(seq)
            for i in range(depth):
                small = sampler.probs(self.head.logits(f[0]), self.name)[0]
                picked = self.head.draft_vocab[sampler.draw_distinct(small, width)]
                row = torch.zeros(sampler.vocab_size, device=small.device)
                row[self.head.draft_vocab] = small
                rows[parent + 1] = row
                first = len(tokens)
                tokens += list(picked)
                parents += [parent] * len(picked)
                parent = first
                if i + 1 < depth:
                    f = self._draft_step(f, picked[:1], i)
        q = torch.zeros(len(tokens) + 1, sampler.vocab_size, device=sampler.device)
        for r, row in rows.items():
            q[r] = row
        ids = torch.stack(tokens) if tokens else torch.zeros(0, dtype=torch.long)
        return TreeDraft(ids.to(sampler.device), parents, q, "without_replacement")

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        """Teacher forcing with the head's own unrolled drafts: a[t, i] scores
        draft i + 1 of the round starting at answer position t (the head's
        inputs: true features up to position start + t - 2, then its own)."""
        import torch

        if tf.hidden is None:
            raise ValueError(f"drafter {self.name} needs the teacher-forced hidden states")
        n, start = len(tf.seq), tf.start
        a = np.full((n - start, k_max), np.nan)
        greedy_drafts = self.greedy or tf.sampler.config.greedy
        with torch.inference_mode():
            feats = tf.hidden[: n - 1].to(self.head.fc.weight.device)
            outputs = self.head.unroll(feats[None], tf.seq[None].to(feats.device), k_max)
            proposed = np.ones(n - start, dtype=bool)  # the gate let drafts 1..i through
            for i, out in enumerate(outputs):
                rows = out[0, start - 2 + i : n - 2]  # depth i + 1 predicting answer[i:]
                if len(rows) == 0:
                    break
                logits = self.head.logits(rows)
                agree = (
                    teacher_forced_acceptance(
                        logits, tf.shifted(i), self.head.draft_vocab, self.greedy, self.confidence
                    )
                    .cpu()
                    .numpy()
                )
                proposed[: len(agree)] &= (
                    gate_passes(logits, greedy_drafts, self.confidence).cpu().numpy()
                )
                a[: len(agree), i] = np.where(proposed[: len(agree)], agree, np.nan)
        return a

    def hf_kwargs(self) -> dict[str, Any] | None:
        return None
