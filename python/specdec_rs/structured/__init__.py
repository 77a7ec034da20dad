"""Structured output: generation constrained to a JSON schema, a regex, a
choice of strings or a grammar, exact under speculation. p = target, q = draft.

The constrained target at a position is p masked to the tokens the grammar
allows there and renormalized: the mask sets the disallowed logits to −inf
before the sampling processors run, so temperature, top-k, top-p and min-p
apply to the allowed tokens alone (as in vLLM and llama.cpp). Speculation
samples exactly from that law (`Constraint`, used by `generate(...,
grammar=...)`): every target row a round reads is masked; a draft the
grammar refuses has p = 0 there and is rejected with certainty; the
residual and the bonus come from masked rows; EOS is allowed only where the
grammar accepts; and where the grammar allows a single tokenization of the
next bytes (a key name, a brace), those forced tokens are proposed as drafts
with a one-hot q, free of any drafter.

The grammar library is llguidance (the `structured` extra; BENCHMARKS.md,
"Structured output: choosing the grammar library").

>>> from specdec_rs.structured import Grammar
>>> Grammar.choice(["yes", "no"]).kind
'choice'
"""

from specdec_rs.structured.constraint import (
    FORCED_SOURCE,
    MAX_FORCED,
    Constraint,
    GrammarDeadEnd,
    GrammarSampler,
    Walk,
    bind,
    masked_logits,
)
from specdec_rs.structured.grammar import Grammar

__all__ = [
    "FORCED_SOURCE",
    "MAX_FORCED",
    "Constraint",
    "Grammar",
    "GrammarDeadEnd",
    "GrammarSampler",
    "Walk",
    "bind",
    "masked_logits",
]
