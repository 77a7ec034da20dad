"""The constrained target's logits (`structured.masked_logits`): the Rust
select against torch's `masked_fill` (the code before it), alone and inside
constrained generation.

- Alone: (n, 49,152) float32 logits and (n, 49,152) bool masks, n = 1, 5,
  9, 17 (a verification block's rows), microseconds a call.
- In generation: issue 38's 20 JSON schemas (`bench_structured.SCHEMAS`),
  SmolLM2 at T = 0, constrained target-only and constrained prompt lookup
  (k = 4), each schema run with either select, the order swapped every
  schema and repeat (one process, so the host's drift falls on both);
  decoding seconds summed, and the ratio of the two methods per select.

    SPECDEC_KERNEL_THREADS=2 python benchmarks/bench_masked_logits.py --activations q8
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import specdec_rs as sd
import specdec_rs.generation.decoder as decoder_module
import specdec_rs.structured.constraint as constraint_module
import torch
from bench_structured import SCHEMAS, drafter_for, workload
from lscpu import flags, lscpu
from specdec_rs import models

METHODS = ("none", "prompt-lookup")


# torch's select: the code before the Rust one, kept for other devices
SELECTS = {"torch": constraint_module.masked_logits_torch, "rust": constraint_module.masked_logits}


def alone(repeats: int = 2000) -> None:
    rng = np.random.default_rng(0)
    print("| rows | torch µs | rust µs | same bits |")
    print("|---:|---:|---:|---|")
    for n in (1, 5, 9, 17):
        logits = torch.from_numpy(rng.standard_normal((n, 49152)).astype(np.float32))
        allowed = rng.random((n, 49152)) < 0.3
        out, us = {}, {}
        for name, select in SELECTS.items():
            out[name] = select(logits, allowed, 49152)
            start = time.perf_counter()
            for _ in range(repeats):
                select(logits, allowed, 49152)
            us[name] = (time.perf_counter() - start) / repeats * 1e6
        bits = {name: o.numpy().view(np.int32) for name, o in out.items()}
        same = np.array_equal(bits["torch"], bits["rust"])
        print(f"| {n} | {us['torch']:.1f} | {us['rust']:.1f} | {same} |")


def in_generation(activations: str, repeats: int, max_new: int) -> None:
    target, tokenizer = models.load_smollm2(activations=activations)
    grammars, prompts = workload(tokenizer)
    drafters = {m: drafter_for(m) for m in METHODS}
    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    tokens: dict[tuple[str, str], list[int]] = {}
    for rep in range(repeats):
        for i, (name, _, _) in enumerate(SCHEMAS):
            order = list(SELECTS) if (i + rep) % 2 == 0 else list(SELECTS)[::-1]
            for select in order:
                decoder_module.masked_logits = SELECTS[select]  # type: ignore[attr-defined]
                constraint_module.masked_logits = SELECTS[select]  # type: ignore[assignment]
                for method, drafter in drafters.items():
                    r = sd.generate(
                        target,
                        drafter,
                        prompts[name],
                        max_new_tokens=max_new,
                        k=4,
                        temperature=0,
                        seed=i,
                        grammar=grammars[name],
                        tokenizer=tokenizer,
                    )
                    seconds[(select, method)] += r.time_total - r.time_prefill
                    key = (name, method)
                    assert tokens.setdefault(key, r.tokens) == r.tokens, f"{key}: tokens differ"
    print(f"\n{activations} activations, {len(SCHEMAS)} schemas x {repeats} repeats, T = 0")
    print("| select | target-only s | prompt lookup s | prompt lookup / target-only speed |")
    print("|---|---:|---:|---:|")
    for select in SELECTS:
        a, b = seconds[(select, "none")], seconds[(select, "prompt-lookup")]
        print(f"| {select} | {a:.3f} | {b:.3f} | {a / b:.3f}x |")
    for method in METHODS:
        ratio = seconds[("torch", method)] / seconds[("rust", method)]
        print(f"{method}: torch / rust seconds {ratio:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--activations", choices=("f32", "q8"), default="q8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    args = ap.parse_args()
    host = lscpu()
    wanted = ("avx2", "avx512f", "avx512_vnni", "amx_tile")
    print(
        f"host: {host.get('Model name', '?')}, family {host.get('CPU family', '?')} "
        f"model {host.get('Model', '?')}; {sorted(flags(host) & set(wanted))}"
    )
    alone()
    in_generation(args.activations, args.repeats, args.max_new_tokens)


if __name__ == "__main__":
    main()
