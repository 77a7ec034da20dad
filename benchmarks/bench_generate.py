"""Real generation on SmolLM2-135M-Instruct: this loop with each drafter at
each γ and policy, target-only through the same loop, and transformers' own
generate() with the matching strategy, all in one process, prompt by prompt
(so machine drift hits every method alike), next to the prediction.
p = target, q = draft, k = γ.

`specdec bench` with this script's defaults (2 prompts, 64 new tokens,
prompt lookup and early exit, 30 timed repeats per cost); every flag is the
command's, and a flag given here overrides the default:

Run: python benchmarks/bench_generate.py [specdec bench flags, e.g. --drafters eagle
     --workloads chat --ks 1 2 3 --policies adaptive heuristic --trees 4 8
     --transformers-ks 2 4 8 --no-transformers --out DIR]
"""

from __future__ import annotations

import sys
import time

import torch
from specdec_rs.cli import main

DEFAULTS = [
    "--prompts",
    "2",
    "--max-new-tokens",
    "64",
    "--drafters",
    "prompt-lookup",
    "early-exit:24",
    "--repeats",
    "30",
]


if __name__ == "__main__":
    start = time.perf_counter()
    status = main(["bench", *DEFAULTS, *sys.argv[1:]])  # later flags win
    elapsed = time.perf_counter() - start
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {elapsed:.0f} s")
    sys.exit(status)
