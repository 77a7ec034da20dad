"""Speculative generation with transformers causal LMs. p = target, q = draft, k = γ.

- `loop`: `generate`, the rounds until the budget or an EOS, γ from a policy.
- `decoder`: `Decoder`, one generation's state and its round (chain or tree).
- (`specdec_rs.rounds`: `Round`, what one round did, and the running `Stats`.)
- `result`: `GenerationResult`, the tokens and the statistics.
- `forward`: the batched target forward many rows share (the engine's,
  `specdec_rs.engine`, which runs many sequences).
- `prefix`: `PrefixCache`, prompts' prefixes' keys and values reused
  between requests.
- `inputs`: the checks of generate()'s inputs.
The checks of a drafter's proposals live with `Draft` / `TreeDraft`
(`specdec_rs.drafters.draft`).
"""

from specdec_rs.generation.decoder import Decoder
from specdec_rs.generation.loop import generate
from specdec_rs.generation.prefix import PrefixCache
from specdec_rs.generation.result import Divergence, GenerationResult, divergence
from specdec_rs.rounds import Round

__all__ = [
    "Decoder",
    "Divergence",
    "GenerationResult",
    "PrefixCache",
    "Round",
    "divergence",
    "generate",
]
