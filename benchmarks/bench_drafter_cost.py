"""What one draft step costs, per drafter, on SmolLM2's GGUF target:
c = a draft step / a target step, each the median of many cached steps
(`measure.costs`: the drafter's own propose of one token and the update that
undoes it), the drafters and the target step interleaved round by round so
the host's drift hits all alike; the median of the rounds is reported.

EAGLE and Medusa run twice: on the Rust kernels (`heads.native`, what the
drafters use) and in torch (what they used before), the same drafter with
its step (EAGLE) or its logits (Medusa) swapped. Beside each, the weight bytes one step reads and
their time at the host's measured read bandwidth (the roofline of a step
bound by its bytes). Also an EAGLE round of k = 4 drafts.

Run: python benchmarks/bench_drafter_cost.py [--activations f32|q8] [--rounds 5] [--repeats 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from bench_forward import host
from specdec_rs import drafters, models, runner
from specdec_rs.measure.costs import decode_step_time, drafter_step_time
from specdec_rs.processors import Sampler, SamplingConfig
from specdec_rs.prompts import workloads
from specdec_rs.timing import median_seconds

SPECS = ("eagle", "medusa", "early-exit:8")


def float_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def step_bytes(spec: str, drafter: Any, native: bool) -> int:
    """Weight bytes one draft step reads (the products'; norms and one
    embedding row left out)."""
    if spec == "eagle":
        head = drafter.head
        body = drafter._step.nbytes if native else float_bytes(head.fc) + float_bytes(head.layer)
        return int(body + head.vocab_rows.nbytes)
    if spec == "medusa":
        heads = drafter.heads
        block = drafter._logits.blocks[0].nbytes if native else float_bytes(heads.blocks[0])
        return int(block + heads.vocab_rows.nbytes)
    view = drafter.view  # early exit: its layers, then the target's LM head
    layers = sum(
        sum(p.nbytes for p in layer.qkv)
        + layer.o_proj.nbytes
        + sum(p.nbytes for p in layer.gate_up)
        + layer.down_proj.nbytes
        for layer in view.model.layers
    )
    return int(layers + view.lm_head.nbytes)


def eagle_round(drafter: Any, target: Any, context: torch.Tensor, k: int, repeats: int) -> float:
    """Median seconds of one EAGLE round of k greedy drafts after `context`."""
    sampler = Sampler(
        SamplingConfig(0.0), models.vocab_of(target), torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        cache = runner.new_cache(target)
        _, h = runner.forward_with_hidden(target, context[:-1], cache, keep=1, hidden=True)
        drafter.start(context, cache, h)
        last = h[-1:]

        def one_round() -> None:
            drafter.propose(context, k, sampler)
            drafter.update(context[:-1], 0, last)

        return median_seconds(one_round, repeats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--activations", choices=("f32", "q8"), default="f32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    started = time.perf_counter()
    machine = host()
    print(machine)
    bandwidth = machine["read GB/s (2 threads)"] * 1e9
    target, tokenizer = models.load_smollm2(activations=args.activations)
    context = workloads.encode(tokenizer, workloads.prompts("chat")[0])
    built = {spec: drafters.from_spec(spec, target, tokenizer) for spec in SPECS}
    eagle, medusa = built["eagle"], built["medusa"]
    native, torch_step = eagle._step, eagle.head.step_into
    swaps = {
        "eagle": (eagle, "_step", native, torch_step),
        "medusa": (medusa, "_logits", medusa._logits, medusa.heads.logits),
    }
    rows = [("eagle (Rust step)", "eagle", True), ("eagle (torch step)", "eagle", False)]
    rows += [("medusa (Rust blocks)", "medusa", True), ("medusa (torch blocks)", "medusa", False)]
    rows += [(spec, spec, False) for spec in SPECS[2:]]
    steps: list[float] = []
    times: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    rounds: dict[str, list[float]] = {"Rust step": [], "torch step": []}
    for _ in range(args.rounds):
        steps.append(decode_step_time(target, context, repeats=args.repeats))
        for name, spec, use_native in rows:
            if spec in swaps:
                drafter, field, rust, reference = swaps[spec]
                setattr(drafter, field, rust if use_native else reference)
            times[name].append(drafter_step_time(built[spec], target, context, args.repeats))
        for label, step in (("Rust step", native), ("torch step", torch_step)):
            eagle._step = step
            rounds[label].append(eagle_round(eagle, target, context, 4, args.repeats // 2))
    for drafter, field, rust, _ in swaps.values():
        setattr(drafter, field, rust)
    step = statistics.median(steps)
    print()
    print(
        f"activations {args.activations}; context {len(context)} tokens (chat prompt 0); "
        f"target step (median of {args.rounds} medians): {step * 1e3:.2f} ms "
        f"(range {min(steps) * 1e3:.2f}-{max(steps) * 1e3:.2f})"
    )
    print()
    print(
        "| drafter | draft step ms | c | c range over rounds | weight MB a step "
        "| roofline ms (bytes / bandwidth) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, spec, use_native in rows:
        t = statistics.median(times[name])
        cs = [x / s for x, s in zip(times[name], steps, strict=True)]
        nbytes = step_bytes(spec, built[spec], use_native)
        print(
            f"| {name} | {t * 1e3:.2f} | {t / step:.3f} | {min(cs):.3f}-{max(cs):.3f} "
            f"| {nbytes / 1e6:.1f} | {nbytes / bandwidth * 1e3:.2f} |"
        )
    print()
    for label, values in rounds.items():
        t = statistics.median(values)
        print(
            f"EAGLE round of 4 greedy drafts, {label}: {t * 1e3:.2f} ms "
            f"({t / step:.2f} target steps)"
        )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
