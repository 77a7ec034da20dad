"""Structured output on SmolLM2 (issue 38's targets): 20 JSON schemas the
project's tests never saw (nested objects, arrays, enums, numbers, strings
with bounds), each asked for in a chat prompt, through `generate(...,
grammar=Grammar.json_schema(schema))`:

- constrained target-only (drafter none: one target step a token);
- constrained speculation: the grammar's forced tokens as free drafts (a
  round of their own, or the tail after the drafter's drafts), and prompt
  lookup or the suffix drafter (k = 4, or `--k default`: the command
  line's default policy) elsewhere; one drafter object per
  method for the whole workload, as in a server (the suffix drafter learns
  from the outputs before, the T = 0 pass's included);

interleaved schema by schema (each method runs each schema back to back),
at T = 0 and T = 0.7 (same seed per schema across methods). Reported:

- validity: of the outputs that stop by the grammar (an EOS), how many
  parse and validate under their schema (`jsonschema`); how many hit the
  budget first;
- tokens/s of each method over the workload, and the ratio to
  constrained target-only in the same run;
- greedy identity: at T = 0 every method's tokens equal target-only's;
- the mask's cost per token: the seconds in llguidance's mask computation
  (every `Constraint.mask` call, timed) per new token, against a target
  step (target-only's target seconds per round); and all the grammar's
  work per token (masks, consumed drafts, rollbacks, forced runs).

    python benchmarks/bench_structured.py --out benchmarks/results/bench-structured
    python benchmarks/bench_structured.py --activations q8   # the q8 target function

Needs the `structured` extra and jsonschema; the target is the packaged
GGUF at its own precision (`models.load_smollm2`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import specdec_rs as sd
from lscpu import flags, lscpu
from specdec_rs import models
from specdec_rs.prompts import workloads
from specdec_rs.structured import Constraint, Grammar

SCHEMAS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "book",
        "a book you like",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 60},
                "author": {"type": "string", "maxLength": 40},
                "year": {"type": "integer", "minimum": 1000, "maximum": 2030},
            },
            "required": ["title", "author", "year"],
        },
    ),
    (
        "weather",
        "today's weather in a city",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
                "sky": {"enum": ["sunny", "cloudy", "rain", "snow"]},
            },
            "required": ["city", "temperature_c", "sky"],
        },
    ),
    (
        "recipe",
        "a simple pancake recipe",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                "ingredients": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 30},
                    "minItems": 2,
                    "maxItems": 6,
                },
            },
            "required": ["name", "servings", "ingredients"],
        },
    ),
    (
        "user",
        "a user account for Alice",
        {
            "type": "object",
            "properties": {
                "username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$"},
                "age": {"type": "integer", "minimum": 13, "maximum": 120},
                "admin": {"type": "boolean"},
            },
            "required": ["username", "age", "admin"],
        },
    ),
    (
        "address",
        "a postal address in Paris",
        {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 50},
                "city": {"type": "string", "maxLength": 30},
                "postcode": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"const": "France"},
            },
            "required": ["street", "city", "postcode", "country"],
        },
    ),
    (
        "order",
        "an order of two items",
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "maxLength": 12},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["sku", "quantity"],
                    },
                    "minItems": 1,
                    "maxItems": 4,
                },
                "paid": {"type": "boolean"},
            },
            "required": ["id", "items", "paid"],
        },
    ),
    (
        "sentiment",
        'the sentiment of "I loved this film"',
        {
            "type": "object",
            "properties": {
                "label": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["label", "confidence"],
        },
    ),
    (
        "event",
        "a meeting next Monday",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
                "attendees": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "maxItems": 5,
                },
            },
            "required": ["title", "date", "attendees"],
        },
    ),
    (
        "planet",
        "the planet Mars",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "moons": {"type": "integer", "minimum": 0, "maximum": 200},
                "rocky": {"type": "boolean"},
                "distance_au": {"type": "number", "minimum": 0, "maximum": 100},
            },
            "required": ["name", "moons", "rocky", "distance_au"],
        },
    ),
    (
        "product",
        "a laptop for sale",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "price": {"type": "number", "minimum": 0, "maximum": 10000},
                "currency": {"enum": ["USD", "EUR", "GBP"]},
                "in_stock": {"type": "boolean"},
            },
            "required": ["name", "price", "currency", "in_stock"],
        },
    ),
    (
        "team",
        "a football team",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "founded": {"type": "integer", "minimum": 1850, "maximum": 2025},
                "coach": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 30},
                        "age": {"type": "integer", "minimum": 20, "maximum": 90},
                    },
                    "required": ["name", "age"],
                },
            },
            "required": ["name", "founded", "coach"],
        },
    ),
    (
        "todo",
        "a to-do list of three tasks",
        {
            "type": "object",
            "properties": {
                "tasks": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "task": {"type": "string", "maxLength": 40},
                            "done": {"type": "boolean"},
                        },
                        "required": ["task", "done"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                }
            },
            "required": ["tasks"],
        },
    ),
    (
        "color",
        "the color of the sky",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "rgb": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 255},
                    "minItems": 3,
                    "maxItems": 3,
                },
            },
            "required": ["name", "rgb"],
        },
    ),
    (
        "movie",
        "a science fiction movie",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 50},
                "genre": {"enum": ["sci-fi", "drama", "comedy", "horror"]},
                "rating": {"type": "number", "minimum": 0, "maximum": 10},
                "cast": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 30},
                    "maxItems": 3,
                },
            },
            "required": ["title", "genre", "rating", "cast"],
        },
    ),
    (
        "flight",
        "a flight from London to Rome",
        {
            "type": "object",
            "properties": {
                "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "seats": {"type": "integer", "minimum": 1, "maximum": 9},
                "class": {"enum": ["economy", "business", "first"]},
            },
            "required": ["from", "to", "seats", "class"],
        },
    ),
    (
        "company",
        "a small software company",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "employees": {"type": "integer", "minimum": 1, "maximum": 100000},
                "public": {"type": "boolean"},
                "offices": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "maxLength": 20},
                            "staff": {"type": "integer", "minimum": 1, "maximum": 5000},
                        },
                        "required": ["city", "staff"],
                    },
                    "maxItems": 3,
                },
            },
            "required": ["name", "employees", "public", "offices"],
        },
    ),
    (
        "song",
        "a famous song",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "artist": {"type": "string", "maxLength": 30},
                "seconds": {"type": "integer", "minimum": 30, "maximum": 900},
                "explicit": {"type": "boolean"},
            },
            "required": ["title", "artist", "seconds", "explicit"],
        },
    ),
    (
        "animal",
        "an animal of the savanna",
        {
            "type": "object",
            "properties": {
                "species": {"type": "string", "maxLength": 30},
                "diet": {"enum": ["herbivore", "carnivore", "omnivore"]},
                "weight_kg": {"type": "number", "minimum": 0, "maximum": 7000},
                "endangered": {"type": "boolean"},
            },
            "required": ["species", "diet", "weight_kg", "endangered"],
        },
    ),
    (
        "invoice",
        "an invoice with two lines",
        {
            "type": "object",
            "properties": {
                "number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                "lines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "item": {"type": "string", "maxLength": 30},
                            "amount": {"type": "number", "minimum": 0, "maximum": 100000},
                        },
                        "required": ["item", "amount"],
                    },
                    "minItems": 1,
                    "maxItems": 3,
                },
                "total": {"type": "number", "minimum": 0},
            },
            "required": ["number", "lines", "total"],
        },
    ),
    (
        "country",
        "the country Japan",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "capital": {"type": "string", "maxLength": 30},
                "population_millions": {"type": "number", "minimum": 0, "maximum": 2000},
                "languages": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 20},
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
            "required": ["name", "capital", "population_millions", "languages"],
        },
    ),
]
METHODS = ("none", "prompt-lookup", "suffix")


class Clock:
    """The seconds spent in one `Constraint` method (and the calls)."""

    def __init__(self, name: str) -> None:
        self.name, self.seconds, self.calls = name, 0.0, 0
        self._original = getattr(Constraint, name)

    def __enter__(self) -> Clock:
        clock, original = self, self._original

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.calls += 1

        setattr(Constraint, self.name, timed)
        return self

    def __exit__(self, *exc: Any) -> None:
        setattr(Constraint, self.name, self._original)


def grammar_seconds(clocks: dict[str, Clock]) -> float:
    """All the grammar's work in a generation: the walks (each mask and
    consumed draft inside), the settles (rollback, the last token), the
    forced runs (a walk's masks are counted once; a tail's forced run
    inside a walk twice, so this is an upper bound)."""
    return clocks["walk"].seconds + clocks["settle"].seconds + clocks["forced"].seconds


def drafter_for(name: str) -> Any:
    return None if name == "none" else sd.drafters.from_spec(name, None, None)


def k_of(k: str, drafter: Any) -> Any:
    """`--k`: an integer, or "default": the command line's default policy for `drafter`."""
    from specdec_rs.policy import measured_policy

    if k != "default":
        return int(k)
    return 4 if drafter is None else measured_policy(drafter)


def workload(tokenizer: Any) -> tuple[dict[str, Grammar], dict[str, Any]]:
    """Per schema name: its grammar, and its chat prompt's ids."""
    grammars = {name: Grammar.json_schema(schema) for name, _, schema in SCHEMAS}
    prompts = {
        name: workloads.encode(
            tokenizer,
            f"Describe {what} as a JSON object with the fields "
            f"{', '.join(schema['properties'])}. Answer with the JSON only.",
        )
        for name, what, schema in SCHEMAS
    }
    return grammars, prompts


def run(
    max_new: int, temperatures: list[float], seed: int, k: str = "4", activations: str = "f32"
) -> dict[str, Any]:
    import jsonschema

    target, tokenizer = models.load_smollm2(activations=activations)
    grammars, prompts = workload(tokenizer)
    drafters = {m: drafter_for(m) for m in METHODS}
    # warm-up: the tokenizer's preparation for grammars and the first forwards
    sd.generate(
        target,
        None,
        prompts["book"],
        max_new_tokens=4,
        grammar=grammars["book"],
        tokenizer=tokenizer,
        temperature=0,
    )
    out: dict[str, Any] = {"temperatures": {}, "k": k}
    for temperature in temperatures:
        rows: list[dict[str, Any]] = []
        for i, (name, _, schema) in enumerate(SCHEMAS):
            for method in METHODS:
                clocks = {n: Clock(n) for n in ("mask", "walk", "settle", "forced")}
                seen: list[Any] = []
                with clocks["mask"], clocks["walk"], clocks["settle"], clocks["forced"]:
                    r = sd.generate(
                        target,
                        drafters[method],
                        prompts[name],
                        max_new_tokens=max_new,
                        k=k_of(k, drafters[method]),
                        temperature=temperature,
                        seed=seed + i,
                        grammar=grammars[name],
                        tokenizer=tokenizer,
                        on_round=seen.append,
                    )
                text = tokenizer.decode(r.tokens, skip_special_tokens=True)
                valid = None
                if r.stop_reason == "eos":
                    try:
                        jsonschema.validate(json.loads(text), schema)
                        valid = True
                    except (ValueError, jsonschema.ValidationError):
                        valid = False
                rows.append(
                    {
                        "schema": name,
                        "method": method,
                        "tokens": r.tokens,
                        "text": text,
                        "stop": r.stop_reason,
                        "valid": valid,
                        "new_tokens": r.new_tokens,
                        "rounds": r.rounds,
                        "forced": r.forced,
                        "forced_accepted": r.forced_accepted,
                        "seconds": r.time_total - r.time_prefill,
                        "target_s": r.time_target,
                        "mask_s": clocks["mask"].seconds,
                        "mask_calls": clocks["mask"].calls,
                        "grammar_s": grammar_seconds(clocks),
                        "kinds": round_kinds(seen),
                    }
                )
            print(temperature, name, [(x["method"], x["stop"], x["valid"]) for x in rows[-3:]])
        summary = summarize(rows, greedy=temperature == 0)
        out["temperatures"][str(temperature)] = {"rows": rows, "summary": summary}
    return out


KINDS = ("forced", "drafts, one kept at least", "drafts, none kept", "no drafts")


def round_kinds(rounds: list[Any]) -> dict[str, list[float]]:
    """Per kind of round: [rounds, tokens emitted, target seconds]. A round
    the grammar forced; one with drafts (a forced tail included) that kept
    one at least; one whose drafts were all rejected; one without drafts."""
    out = {kind: [0, 0, 0.0] for kind in KINDS}
    for r in rounds:
        kind = (
            KINDS[0]
            if r.forced
            else KINDS[3]
            if not r.drafted
            else KINDS[1]
            if r.accepted
            else KINDS[2]
        )
        out[kind][0] += 1
        out[kind][1] += len(r.emitted)
        out[kind][2] += r.target_s
    return out


def summarize(rows: list[dict[str, Any]], greedy: bool) -> dict[str, Any]:
    per: dict[str, Any] = {}
    base = None
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        tokens = sum(r["new_tokens"] for r in mine)
        seconds = sum(r["seconds"] for r in mine)
        ended = [r for r in mine if r["stop"] == "eos"]
        per[method] = {
            "ended_by_grammar": len(ended),
            "valid": sum(bool(r["valid"]) for r in ended),
            "budget_first": len(mine) - len(ended),
            "tokens": tokens,
            "tokens_per_second": tokens / seconds,
            "tokens_per_pass": tokens / sum(r["rounds"] for r in mine),
            "forced_share": sum(r["forced_accepted"] for r in mine) / tokens,
            "mask_ms_per_token": 1000 * sum(r["mask_s"] for r in mine) / tokens,
            "mask_calls_per_token": sum(r["mask_calls"] for r in mine) / tokens,
            "grammar_ms_per_token": 1000 * sum(r["grammar_s"] for r in mine) / tokens,
            "rounds_by_kind": {
                kind: {
                    "rounds": sum(r["kinds"][kind][0] for r in mine),
                    "tokens": sum(r["kinds"][kind][1] for r in mine),
                    "target_ms_per_round": 1000
                    * sum(r["kinds"][kind][2] for r in mine)
                    / max(1, sum(r["kinds"][kind][0] for r in mine)),
                }
                for kind in KINDS
            },
        }
        if method == "none":
            base = per[method]["tokens_per_second"]
            per[method]["target_step_ms"] = (
                1000 * sum(r["target_s"] for r in mine) / sum(r["rounds"] for r in mine)
            )
    assert base is not None
    for method in METHODS:
        per[method]["vs_target_only"] = per[method]["tokens_per_second"] / base
    if greedy:  # sampled runs agree in law, not token by token
        plain = {r["schema"]: r["tokens"] for r in rows if r["method"] == "none"}
        per["identical_to_target_only"] = {
            m: all(r["tokens"] == plain[r["schema"]] for r in rows if r["method"] == m)
            for m in METHODS
        }
    return per


def host() -> str:
    """The CPU as lscpu names it, its family/model, cores and vector units."""
    fields = lscpu()
    if not fields:
        return "unknown"
    have = flags(fields)
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in have]
    return (
        f"{fields.get('Model name', '?')} (family {fields.get('CPU family', '?')} model "
        f"{fields.get('Model', '?')}), {os.cpu_count()} cores, {' '.join(isa)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--k",
        default="4",
        help="drafts a round: an integer, or 'default' for the command line's default "
        "policy (`measured_policy`, a fresh one each generation)",
    )
    parser.add_argument(
        "--activations",
        default="f32",
        choices=("f32", "q8"),
        help="the target function (`load_smollm2(activations=...)`): every method runs it",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    temperatures = [float(t) for t in args.temperatures.split(",")]
    if args.k != "default" and not args.k.isdigit():
        parser.error(f"--k {args.k!r}: expected an integer >= 1 or 'default'")
    result = run(args.max_new_tokens, temperatures, args.seed, args.k, args.activations)
    result["activations"] = args.activations
    result["host"] = host()
    print("host:", result["host"])
    for t, block in result["temperatures"].items():
        print(f"T = {t}:", json.dumps(block["summary"], indent=1))
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
