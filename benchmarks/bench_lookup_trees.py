"""Prompt lookup at greedy: a chain, a trie of every match, and a trie whose
depth is capped per match, replayed on the target's own greedy answers.

At temperature 0 a round's outcome is fixed by the answer: the round keeps
the longest path of the draft (chain or tree) that spells the answer's next
tokens, then one more token. Replaying the rounds as `generate` places them
(each starts where the last ended) gives the tokens per target pass exactly,
with no timing noise. The answers are SmolLM2's greedy answers to the
held-out built-in prompts.

Layouts, each with a budget of B draft tokens:
- chain: the longest match's continuation, B tokens (`PromptLookup.propose`);
- trie: the continuations of every match, longest match first, merged into a
  prefix tree of B nodes (`PromptLookup.propose_tree`);
- capped trie: the same continuations, each cut to the largest common depth D
  at which their trie still fits in B nodes, then the longest match's
  continuation extended with what is left of B.

Run: python benchmarks/bench_lookup_trees.py [--prompts 8] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import specdec_rs as sd
from specdec_rs import models
from specdec_rs.drafters.lookup import lookup, lookup_all
from specdec_rs.prompts import workloads
from specdec_rs.trees import trie

MIN_NGRAM, MAX_NGRAM = 2, 64  # PromptLookup's defaults

Layout = Callable[[np.ndarray, int], tuple[list[int], list[int]]]


def chain(seq: np.ndarray, budget: int) -> tuple[list[int], list[int]]:
    tokens = lookup(seq, budget, MIN_NGRAM, MAX_NGRAM).tolist()
    return tokens, list(range(-1, len(tokens) - 1))


def full_trie(seq: np.ndarray, budget: int) -> tuple[list[int], list[int]]:
    found = lookup_all(seq, budget, MIN_NGRAM, MAX_NGRAM)
    return trie([c.tolist() for c in found], budget)


def capped_trie(seq: np.ndarray, budget: int) -> tuple[list[int], list[int]]:
    found = [c.tolist() for c in lookup_all(seq, budget, MIN_NGRAM, MAX_NGRAM)]
    if not found:
        return [], []
    depth = 1
    for d in range(2, budget + 1):
        if len(trie([c[:d] for c in found], budget + 1)[0]) > budget:
            break
        depth = d
    return trie([c[:depth] for c in found] + [found[0]], budget)


def kept(tokens: list[int], parents: list[int], answer: list[int]) -> int:
    """Draft tokens a greedy round keeps: the longest path spelling `answer`."""
    node, m = -1, 0
    while m < len(answer):
        pairs = enumerate(zip(tokens, parents, strict=True))
        child = next((i for i, (t, p) in pairs if p == node and t == answer[m]), None)
        if child is None:
            break
        node, m = child, m + 1
    return m


def replay(layout: Layout, budget: int, answers: list[tuple[list[int], list[int]]]) -> Any:
    """(mean tokens per pass over the answers, mean draft nodes per round)."""
    per_answer, nodes = [], []
    for prompt, answer in answers:
        seq = np.array(prompt + answer, dtype=np.int64)
        t, rounds = 0, 0
        while t < len(answer):
            tokens, parents = layout(seq[: len(prompt) + t], budget)
            t += kept(tokens, parents, answer[t:]) + 1
            rounds += 1
            nodes.append(len(tokens))
        per_answer.append(len(answer) / rounds)
    return float(np.mean(per_answer)), float(np.mean(nodes))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16])
    args = parser.parse_args()
    target, tokenizer = models.load_smollm2()
    layouts: dict[str, Layout] = {"chain": chain, "trie": full_trie, "capped trie": capped_trie}
    for workload in workloads.WORKLOADS:
        answers = []
        for ids in workloads.prompt_set(tokenizer, workload, args.prompts):
            out = sd.generate(
                target,
                sd.PromptLookup(),
                ids,
                max_new_tokens=args.max_new_tokens,
                k=8,
                temperature=0,
            )
            answers.append((ids.tolist(), out.tokens))
        print(f"\n### {workload}, temperature 0, {args.prompts} prompts\n")
        print("| layout | " + " | ".join(f"B = {b}" for b in args.budgets) + " |")
        print("|---|" + "---|" * len(args.budgets))
        for name, layout in layouts.items():
            cells = [replay(layout, b, answers) for b in args.budgets]
            row = " | ".join(f"{tpp:.3f} ({n:.1f} nodes)" for tpp, n in cells)
            print(f"| {name} | {row} |")


if __name__ == "__main__":
    main()
