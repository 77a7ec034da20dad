"""What the trained heads (EAGLE, Medusa) share: the check that a head was
trained for this target, the q rows of a draft over the head's draft
vocabulary, the confidence gate's maths, and teacher-forced acceptance.
p = target, q = draft, k = γ.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from specdec_rs import models
from specdec_rs.drafters.base import TeacherForced
from specdec_rs.processors import Sampler

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from specdec_rs.heads import EagleHead, MedusaHeads, TargetPrint


class HeadTarget:
    """The check that a head was built for the target it drafts for
    (`check`), kept per drafter: the print of a target's weights (about 25 ms
    on SmolLM2; it reads every weight, so the first forward after it also
    starts from cold caches) is taken once per target object, not at every
    generation. The device check runs every time."""

    def __init__(self, head: EagleHead | MedusaHeads, fingerprint: TargetPrint | str, name: str):
        self.head, self.fingerprint, self.name = head, fingerprint, name
        self._matched: weakref.ref[PreTrainedModel] | None = None  # the target that matched

    def check(self, target: PreTrainedModel) -> None:
        """ValueError unless `target` is the model the head was built on
        (`fingerprint`: the print of that model, taken when the head loaded)
        and on the head's device."""
        from specdec_rs.heads.files import target_mismatch

        if self._matched is None or self._matched() is not target:
            why = target_mismatch(self.fingerprint, target)
            if why is not None:
                raise ValueError(
                    f"drafter {self.name} was trained for another target ({why}); "
                    "load or train a head for this target"
                )
            self._matched = weakref.ref(target)
        if self.head.draft_vocab.device != models.device_of(target):
            raise ValueError(
                f"drafter {self.name} is on {self.head.draft_vocab.device} but the target on "
                f"{models.device_of(target)}; "
                "move both to one device"
            )


def draft_rows(
    logits: torch.Tensor, draft_vocab: torch.Tensor, sampler: Sampler, greedy: bool, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduced logits (n, N) -> (tokens (n,) in the full vocabulary, q (n, V)):
    processing and sampling over D equal processing the full row with -inf
    outside D (temperature, top-k and top-p ignore -inf entries)."""
    import torch

    idx, q_small = sampler.draw(sampler.probs(logits, name), greedy=greedy)
    q = torch.zeros(len(idx), sampler.vocab_size, device=q_small.device)
    q[:, draft_vocab] = q_small
    return draft_vocab[idx], q


def gated_q(q: torch.Tensor, confidence: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows q (n, N) behind a gate τ: (q' = q·1[q > τ] / Q (n, N), Q (n,)),
    the law of a draft x ~ q kept iff q(x) > τ, and the chance it is kept."""
    kept = q * (q > confidence)
    mass = kept.sum(-1)
    return kept / mass.clamp_min(1e-30)[:, None], mass


def gated_rows(
    logits: torch.Tensor,
    draft_vocab: torch.Tensor,
    sampler: Sampler,
    greedy: bool,
    name: str,
    confidence: float,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`draft_rows` for one row (1, N) behind a confidence gate τ: None
    (stop drafting) unless the draft's probability exceeds τ.

    Greedy drafts (one-hot q) read their confidence from the head's
    softmax; the stop is then a function of the head's state, and q stays
    one-hot. Sampled drafts x ~ q are kept iff q(x) > τ, so a kept draft is
    distributed as q' = q·1[q > τ] / Q (Q = Σ_{q > τ} q), and q' is the row
    returned: verifying against q' keeps the output exact, since with
    probability Q the position is a speculative step with q' and otherwise
    the target samples it itself (P = Q·p + (1 − Q)·p = p)."""
    if confidence <= 0.0:
        return draft_rows(logits, draft_vocab, sampler, greedy, name)
    if greedy or sampler.config.greedy:
        probs = logits.float().softmax(-1)
        if float(probs.max()) <= confidence:
            return None
        return draft_rows(logits, draft_vocab, sampler, True, name)
    q_small = sampler.probs(logits, name)
    idx, _ = sampler.draw(q_small)
    if float(q_small[0, idx[0]]) <= confidence:
        return None
    q = q_small.new_zeros(1, sampler.vocab_size)
    q[:, draft_vocab] = gated_q(q_small, confidence)[0]  # Q >= q(x) > τ: no clamp
    return draft_vocab[idx], q


def teacher_forced_acceptance(
    logits: torch.Tensor,
    tf: TeacherForced,
    draft_vocab: torch.Tensor,
    greedy: bool,
    confidence: float = 0.0,
) -> torch.Tensor:
    """Acceptance of drafts with reduced `logits` (n, N), row t drafting
    answer[t] (scored against tf.p[t]): at greedy the argmax agreement, with a
    one-hot q p(argmax), otherwise Σ_x min(p(x), q(x)). With a confidence
    gate τ, sampled drafts score Q·Σ_x min(p(x), q'(x)): the chance the draft
    is proposed (Q) and kept (q' as in `gated_rows`); greedy drafts the gate
    stops are the caller's to mark (`gate_passes`)."""
    import torch

    if tf.sampler.config.greedy or greedy:
        x = draft_vocab[logits.argmax(-1)]
        if tf.sampler.config.greedy:
            return (x == tf.answer[: len(x)].to(x.device)).double()
        return tf.p[: len(x)].gather(-1, x[:, None])[:, 0].double()
    q = tf.sampler.probs(logits)
    p = tf.p[: len(q), draft_vocab.to(tf.p.device)]
    if confidence <= 0.0:
        return torch.minimum(p, q.to(p.device)).sum(-1).double()
    q_gated, mass = gated_q(q, confidence)
    return (mass.to(p.device) * torch.minimum(p, q_gated.to(p.device)).sum(-1)).double()


def gate_passes(logits: torch.Tensor, greedy_drafts: bool, confidence: float) -> torch.Tensor:
    """(n,) bool: whether a greedy draft from each row of reduced `logits`
    passes the confidence gate (all True without a gate or for sampled drafts,
    whose gate `teacher_forced_acceptance` folds into the score)."""
    import torch

    if confidence <= 0.0 or not greedy_drafts:
        return torch.ones(len(logits), dtype=torch.bool, device=logits.device)
    return logits.float().softmax(-1).amax(-1) > confidence
