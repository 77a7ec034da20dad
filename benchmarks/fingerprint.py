"""Behaviour fingerprint of the generation paths, for a behaviour-preserving
change: run it in the tree before and after (each with its own built
extension), then compare the two files.

    python benchmarks/fingerprint.py --out /tmp/before.json          # old tree
    python benchmarks/fingerprint.py --out /tmp/after.json           # new tree
    python benchmarks/fingerprint.py --compare /tmp/before.json /tmp/after.json

Each setting records what a run decides, none of its timings: tokens, the
acceptance histogram, per-position reached / kept counts, k and kept per
round, stop reason. Settings (deterministic: fixed seeds, no policy that
reads a clock):
- `generate` on tiny float32 Llamas: {none, prompt lookup, draft model,
  early exit} x {k = 3, HeuristicK, AdaptiveK} x {greedy, T = 1, T = 0.8
  with top-k 20 / top-p 0.9} x 3 seeds x {in place, gathered}, trees of 4
  nodes and AdaptiveTree, an EOS stop;
- `generate_batch` / `BatchEngine` rows (fixed k, T = 0 and 0.8, more
  requests than rows: continuous batching), on the tiny Llama and on the
  SmolLM2 GGUF with chunked prefill and a prefix cache;
- server streams (a tiny Llama over SmolLM2's tokenizer, 6 concurrent
  chat streams, fixed k, T = 0 and 0.8 with seeds);
- SmolLM2 (GGUF) with prompt lookup, suffix, EAGLE, Medusa, the hybrid and
  lookahead at k = 3, and trees of 6 nodes, at T = 0 and 0.7.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import specdec_rs as sd
from specdec_rs import models
from specdec_rs.drafters import registry

Record = dict[str, Any]


def record(r: Any) -> Record:
    """What a GenerationResult decided (no timings)."""
    return {
        "tokens": list(r.tokens),
        "stop": r.stop_reason,
        "rounds": r.rounds,
        "drafted": r.drafted,
        "histogram": list(r.accepted_histogram),
        "reached": list(r.reached),
        "accepted": list(r.accepted),
        "k_per_round": list(r.k_per_round),
        "kept_per_round": list(r.kept_per_round),
        "k": r.k,
        "policy": r.policy,
        "tree": r.tree,
    }


SAMPLING = {
    "greedy": {"temperature": 0.0},
    "t1": {"temperature": 1.0},
    "t08": {"temperature": 0.8, "top_k": 20, "top_p": 0.9},
}


def tiny_settings(out: dict[str, Record]) -> None:
    target = models.tiny_llama(num_layers=3, seed=1)
    draft = models.tiny_llama(num_layers=1, seed=2)
    prompt = [5, 6, 7, 5, 6, 7, 1, 2, 5, 6]
    makers: dict[str, Callable[[], Any]] = {
        "none": lambda: None,
        "lookup": sd.PromptLookup,
        "model": lambda: sd.DraftModel(draft),
        "early": lambda: sd.EarlyExit(target, 1),
    }
    policies: dict[str, Callable[[], Any]] = {
        "k3": lambda: 3,
        "heuristic": sd.HeuristicK,
        "adaptive": lambda: sd.AdaptiveK(0.2),
    }
    for dname, make in makers.items():
        for pname, policy in policies.items():
            for sname, sampling in SAMPLING.items():
                for seed in range(3):
                    for transfer in ("auto", "gathered"):
                        r = sd.generate(
                            target, make(), prompt, max_new_tokens=24, k=policy(),
                            seed=seed, eos_token_id=[], transfer=transfer, **sampling,
                        )  # fmt: skip
                        out[f"tiny/{dname}/{pname}/{sname}/{seed}/{transfer}"] = record(r)
    for dname in ("lookup",):  # the tiny drafters that draft trees
        for sname, sampling in SAMPLING.items():
            for seed in range(3):
                for tname, tree in (
                    ("tree4", 4),
                    ("adaptive-tree", sd.AdaptiveTree(0.2, [1.0 + 0.1 * i for i in range(9)])),
                ):
                    r = sd.generate(
                        target, makers[dname](), prompt, max_new_tokens=24, tree=tree,
                        seed=seed, eos_token_id=[], **sampling,
                    )  # fmt: skip
                    out[f"tiny-tree/{dname}/{tname}/{sname}/{seed}"] = record(r)
    r = sd.generate(
        target, sd.PromptLookup(), prompt, max_new_tokens=40, k=3, temperature=0.0,
        eos_token_id=[6, 7],
    )  # fmt: skip
    out["tiny/eos"] = record(r)


def batch_settings(out: dict[str, Record]) -> None:
    target = models.tiny_llama(num_layers=3, seed=1)
    draft = models.tiny_llama(num_layers=1, seed=2)
    prompts = [[5, 6, 7, 5, 6], [9, 8, 9, 8], [1, 2, 3], [4, 4, 4, 4, 4, 4], [7, 1, 7, 1, 7]]
    for dname, make in (("lookup", sd.PromptLookup), ("model", lambda: sd.DraftModel(draft))):
        for temperature in (0.0, 0.8):
            for rows in (2, 5):
                res = sd.generate_batch(
                    target, make, prompts, max_new_tokens=16, max_batch=rows, k=3,
                    temperature=temperature, seed=11, eos_token_id=[],
                )  # fmt: skip
                for i, f in enumerate(res.rows):
                    out[f"batch/{dname}/{temperature}/{rows}/{i}"] = record(f.result)


def smollm2_settings(out: dict[str, Record]) -> None:
    from specdec_rs.generation.prefix import PrefixCache

    try:
        from specdec_rs.prompts import workloads
    except ImportError:  # a tree before the prompts' own package
        from specdec_rs.measure import workloads  # type: ignore[no-redef]

    target, tokenizer = models.load_smollm2(weights="gguf")
    ids = [workloads.prompt_set(tokenizer, w, 1)[0].tolist() for w in ("code", "chat")]
    specs = ["prompt-lookup", "suffix", "eagle", "medusa", "hybrid", "lookahead"]
    for spec in specs:
        for temperature in (0.0, 0.7):
            for w, prompt in zip(("code", "chat"), ids, strict=True):
                drafter = registry.from_spec(spec, target, tokenizer)
                r = sd.generate(
                    target, drafter, prompt, max_new_tokens=32, k=3, temperature=temperature,
                    seed=3,
                )  # fmt: skip
                out[f"smollm2/{spec}/k3/{temperature}/{w}"] = record(r)
                if spec in ("prompt-lookup", "eagle", "medusa", "hybrid"):
                    drafter = registry.from_spec(spec, target, tokenizer)
                    r = sd.generate(
                        target, drafter, prompt, max_new_tokens=32, tree=6,
                        temperature=temperature, seed=3,
                    )  # fmt: skip
                    out[f"smollm2/{spec}/tree6/{temperature}/{w}"] = record(r)
    # batched rows with chunked prefill and a prefix cache (the second pass reuses)
    prefix = PrefixCache(64)
    for temperature in (0.0, 0.8):
        for rep in range(2):
            engine = sd.BatchEngine(
                target, sd.PromptLookup, max_batch=2, k=3, prefill_chunk=32, prefix_cache=prefix,
                vocab_size=len(tokenizer),
            )  # fmt: skip
            requests = [
                sd.Request(p, 24, temperature, seed=5 + i, eos_token_id=[])
                for i, p in enumerate([*ids, ids[0]])
            ]
            res = engine.run(requests)
            for i, f in enumerate(res.rows):
                out[f"smollm2-batch/{temperature}/{rep}/{i}"] = record(f.result)


def server_settings(out: dict[str, Record]) -> None:
    import tempfile

    import openai

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from serve_fixtures import save_model, serve

    with tempfile.TemporaryDirectory() as folder:
        path = save_model(Path(folder))
        bg = serve(path, k=2, drafter="prompt-lookup")
        try:
            client = openai.OpenAI(base_url=bg.url + "/v1", api_key="unused", max_retries=0)
            results: dict[str, Record] = {}

            def stream(name: str, message: str, temperature: float, seed: int) -> None:
                pieces = []
                for chunk in client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": message}],
                    max_tokens=24, temperature=temperature, seed=seed, stream=True,
                ):  # fmt: skip
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces.append(chunk.choices[0].delta.content)
                results[name] = {"text": "".join(pieces)}

            jobs = [
                (f"serve/{t}/{i}", f"Say {i} things about the number {i}.", t, 100 + i)
                for t in (0.0, 0.8)
                for i in range(3)
            ]
            threads = [threading.Thread(target=stream, args=job) for job in jobs]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            out.update(results)
        finally:
            bg.stop()


def compare(a: Path, b: Path) -> int:
    before, after = json.loads(a.read_text()), json.loads(b.read_text())
    keys = sorted(set(before) | set(after))
    differ = [k for k in keys if before.get(k) != after.get(k)]
    for k in differ[:20]:
        print(f"differs: {k}")
    print(f"{len(keys) - len(differ)} of {len(keys)} settings identical")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--only", choices=("tiny", "batch", "smollm2", "server"), nargs="*")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("--out FILE or --compare BEFORE AFTER")
    out: dict[str, Record] = {}
    parts = {
        "tiny": tiny_settings,
        "batch": batch_settings,
        "server": server_settings,
        "smollm2": smollm2_settings,
    }
    for name, part in parts.items():
        if args.only and name not in args.only:
            continue
        part(out)
        print(f"{name}: {len(out)} settings so far", flush=True)
    args.out.write_text(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
