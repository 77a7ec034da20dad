"""The Medusa drafter: m trained heads on the target's last hidden state
propose up to m tokens at once, each drawn from its own head's row.
p = target, q = draft, k = γ.

The newest feature the loop holds is f at the position before the last
token x (the last token's own feature comes with the next verification);
the target's LM head decoded f into x, so head i drafts the token i past x.
Each draft is drawn from its own q row, which does not depend on the earlier
drafts: the chain is exact. k = 1 gives the one-token drafter.
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
    draft_rows,
    teacher_forced_acceptance,
)
from specdec_rs.processors import Sampler
from specdec_rs.trees import chain_with_alternatives

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache

    from specdec_rs.heads import MedusaHeads, TargetPrint


@register(
    "medusa", arg="optional-path", help="the trained Medusa heads (the shipped ones, or PATH)"
)
class Medusa:
    needs_target_hidden = True

    def __init__(
        self,
        heads: MedusaHeads,
        fingerprint: TargetPrint | str,
        *,
        greedy: bool = False,
        name: str = "medusa",
    ):
        self.heads = heads
        self.fingerprint = fingerprint
        self.greedy = _checks.boolean(greedy, "greedy")
        self.name = name
        self._target_check = HeadTarget(self.heads, fingerprint, name)
        self._feature: torch.Tensor | None = None
        from specdec_rs.heads.native import NativeMedusaLogits

        # the heads' logits on the Rust kernels where they can run there, else in torch
        self._logits = NativeMedusaLogits.of(heads) or heads.logits

    @classmethod
    def from_spec(cls, arg: Any, target: Any, tokenizer: Any, greedy: bool) -> Medusa:
        """``medusa`` (the shipped heads) or ``medusa:PATH``."""
        from specdec_rs import heads

        loaded = cast("MedusaHeads", heads.load(arg or heads.shipped("medusa"), target, "medusa"))
        return cls(
            loaded,
            heads.TargetPrint.of(target),
            greedy=greedy,
            name="medusa" if arg is None else f"medusa:{arg}",
        )

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    def check_target(self, target: PreTrainedModel) -> None:
        self._target_check.check(target)

    def start(
        self, seq: torch.Tensor, target_cache: Cache, target_hidden: torch.Tensor | None
    ) -> None:
        self.update(seq, 0, target_hidden)

    def update(
        self, seq: torch.Tensor, num_accepted: int, target_hidden: torch.Tensor | None
    ) -> None:
        if target_hidden is None:
            raise ValueError(f"drafter {self.name} needs the target's hidden states")
        self._feature = target_hidden[-1] if len(target_hidden) else None

    def propose(self, seq: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        import torch

        k = min(k, self.num_heads)
        if k == 0 or self._feature is None:
            return empty_draft(sampler)
        with torch.inference_mode():
            logits = self._logits(self._feature, heads=k)  # (k, N)
            tokens, q = draft_rows(logits, self.heads.draft_vocab, sampler, self.greedy, self.name)
        return Draft(tokens, q)

    tree_width = 2  # candidates per head in propose_tree

    def propose_tree(self, seq: torch.Tensor, budget: int, sampler: Sampler) -> TreeDraft:
        """Top-k per head: head j's best token continues the chain and its next
        tree_width - 1 tokens sit beside it as leaves (budget // tree_width
        heads, at most all of them); fixed children."""
        import torch

        depth = min(budget // self.tree_width, self.num_heads)
        if depth == 0 or self._feature is None:
            return fixed_tree([], [], sampler)
        with torch.inference_mode():
            logits = self._logits(self._feature, heads=depth)  # (depth, N)
            top = self.heads.draft_vocab[logits.topk(self.tree_width, dim=-1).indices]
        chain = [int(t) for t in top[:, 0]]
        alternatives = [[int(t) for t in row[1:]] for row in top]
        return fixed_tree(*chain_with_alternatives(chain, alternatives), sampler)

    def acceptance(self, tf: TeacherForced, k_max: int) -> np.ndarray:
        """a[t, i]: head i + 1 on the true feature at position start + t - 2
        drafting answer[t + i]; NaN past the last head."""
        import torch

        if tf.hidden is None:
            raise ValueError(f"drafter {self.name} needs the teacher-forced hidden states")
        n, start = len(tf.seq), tf.start
        a = np.full((n - start, k_max), np.nan)
        with torch.inference_mode():
            for i in range(min(k_max, self.num_heads)):
                feats = tf.hidden[start - 2 : n - 2 - i].to(self.heads.draft_vocab.device)
                if len(feats) == 0:
                    break
                logits = self.heads.logits(feats, heads=i + 1)[:, i]
                agree = teacher_forced_acceptance(
                    logits, tf.shifted(i), self.heads.draft_vocab, self.greedy
                )
                a[: len(agree), i] = agree.cpu().numpy()
        return a

    def hf_kwargs(self) -> dict[str, Any] | None:
        return None
