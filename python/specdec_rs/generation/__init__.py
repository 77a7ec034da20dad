"""Speculative generation with transformers causal LMs. p = target, q = draft, k = γ.

- `loop`: `generate`, the rounds until the budget or an EOS, γ from a policy.
- `decoder`: `Decoder`, one generation's state and its round (chain or tree).
- `rounds`: `Round`, what one round did, and the running `Stats`.
- `result`: `GenerationResult`, the tokens and the statistics.
- `batch`: `BatchEngine` and `generate_batch`, many rows per target pass;
  `forward` its batched target forward, `profile` the T(B, n, L) table the
  goodput policy reads.
- `prefix`: `PrefixCache`, prompts' prefixes' keys and values reused
  between requests.
- `inputs`: the checks of generate()'s inputs.
The checks of a drafter's proposals live with `Draft` / `TreeDraft`
(`specdec_rs.drafters.draft`).
"""

from specdec_rs.generation.batch import (
    BatchEngine,
    BatchResult,
    BatchStep,
    Finished,
    Request,
    generate_batch,
)
from specdec_rs.generation.decoder import Decoder
from specdec_rs.generation.loop import generate
from specdec_rs.generation.prefix import PrefixCache
from specdec_rs.generation.result import Divergence, GenerationResult, divergence
from specdec_rs.generation.rounds import Round

__all__ = [
    "BatchEngine",
    "BatchResult",
    "BatchStep",
    "Finished",
    "Request",
    "generate_batch",
    "Decoder",
    "Divergence",
    "GenerationResult",
    "PrefixCache",
    "Round",
    "divergence",
    "generate",
]
