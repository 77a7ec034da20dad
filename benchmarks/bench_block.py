"""Block against token-wise verification on paired rounds: the same p/q traces.

Generation on SmolLM2 with a drafter records every round's p rows, q rows and
drafts (as the loop hands them to `verify`); each recorded round is then
verified `--replays` times with each method (seeds 0..R-1). Tokens per round
are compared on the same rounds: the mean difference and its standard error
(rounds are independent, replays average the verifier's own randomness).

Run: python benchmarks/bench_block.py [--drafters eagle prompt-lookup]
     [--temperature 1] [--k 4] [--prompts 3] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import specdec_rs as sd
from specdec_rs import drafters, models
from specdec_rs.prompts import workloads


def record(
    target: Any, tokenizer: Any, spec: str, args: argparse.Namespace
) -> list[tuple[Any, ...]]:
    """The (p, q, drafts) of every round with drafts (as each `Round` hands
    them to the verifier), over the prompts of both workloads."""
    rounds: list[tuple[Any, ...]] = []

    def recording(r: sd.Round) -> None:
        if r.drafted:
            rounds.append((r.p.numpy().copy(), r.q.numpy().copy(), r.tokens.numpy().copy()))

    for workload in workloads.WORKLOADS:
        for i, ids in enumerate(workloads.prompt_set(tokenizer, workload, args.prompts)):
            drafter = drafters.from_spec(spec, target, tokenizer)
            sd.generate(
                target,
                drafter,
                ids,
                max_new_tokens=args.max_new_tokens,
                k=args.k,
                temperature=args.temperature,
                seed=i,
                on_round=recording,
            )
    return rounds


def paired(rounds: list[tuple[Any, ...]], replays: int) -> tuple[float, float, float, float]:
    """(token-wise mean, block mean, mean difference, its standard error) of tokens per round."""
    diffs, token_means, block_means = [], [], []
    for p, q, d in rounds:
        t = np.mean([len(sd.verify(p, q, d, s)) for s in range(replays)])
        b = np.mean([len(sd.verify(p, q, d, s, method="block")) for s in range(replays)])
        token_means.append(t)
        block_means.append(b)
        diffs.append(b - t)
    n = len(diffs)
    return (
        float(np.mean(token_means)),
        float(np.mean(block_means)),
        float(np.mean(diffs)),
        float(np.std(diffs, ddof=1) / np.sqrt(n)),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--drafters", nargs="+", default=["eagle", "prompt-lookup"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--replays", type=int, default=200)
    args = parser.parse_args()
    if args.temperature <= 0:  # one-hot target rows: both rules keep the same drafts
        parser.error("--temperature must be > 0: at 0 block and token verification agree")
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    target, tokenizer = models.load_smollm2()
    print(
        f"SmolLM2-135M-Instruct, float32, temperature {args.temperature:g}, k = {args.k}, "
        f"{args.prompts} prompts of each workload, {args.replays} replays per round\n"
    )
    print("| drafter | rounds | token-wise tokens/round | block tokens/round | gain | ± s.e. |")
    print("|---|---|---|---|---|---|")
    for spec in args.drafters:
        rounds = record(target, tokenizer, spec, args)
        t, b, diff, se = paired(rounds, args.replays)
        print(
            f"| {spec} | {len(rounds)} | {t:.3f} | {b:.3f} | {100 * diff / t:+.1f}% "
            f"| {100 * se / t:.1f}% |"
        )


if __name__ == "__main__":
    main()
