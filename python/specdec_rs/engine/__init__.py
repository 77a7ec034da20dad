"""Many sequences per target pass. p = target, q = draft, k = γ.

- `requests`: `Request`, its checks at submission (once), `Finished`.
- `scheduler`: the slots, the queue, the cache-position budget.
- `engine`: `BatchEngine`, the batch round (each row's begin, one target
  forward, each row's finish).
- `generate`: `generate_batch`, many prompts through one engine.
- `profile`: T(B, n, L) measured on an engine's forward and cached, the
  `ForwardProfile` the goodput policy reads.
- `build`: `engine_for`, an engine from drafter specs with the one default
  γ rule (used by the CLI, the server and the benchmarks).
"""

from specdec_rs.engine.engine import BatchEngine, BatchResult, BatchStep
from specdec_rs.engine.generate import generate_batch
from specdec_rs.engine.requests import Finished, Request

__all__ = [
    "BatchEngine",
    "BatchResult",
    "BatchStep",
    "Finished",
    "Request",
    "generate_batch",
]
