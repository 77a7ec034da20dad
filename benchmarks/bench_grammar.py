"""Choosing the grammar library for structured output (issue 38, point 1):
llguidance against xgrammar on SmolLM2's tokenizer (49,152 tokens).

For each JSON schema of a small workload (nested objects, arrays, enums,
numbers, strings with patterns, optional fields), both libraries:

- compile the schema (the tokenizer prepared once beforehand, timed apart:
  the second preparation in the process, the first also loading the library);
- walk one valid document token by token (the document's own tokens, so
  both see the same sequence), computing the allowed-token bitmask before
  every token into a preallocated one: the mask time per token (median and p99);
- check that every token of the document is allowed where it comes and that
  the grammar accepts at the end (and not one token earlier);
- roll back 4 tokens, recompute the mask and consume the 4 again (what
  verification past a rejected draft needs): the rollback's time, and that
  the masks after it equal the first ones bit for bit;
- report the forced tokens the library offers at the start of the document
  (a grammar's free drafts).

Then one schema feature per row that a user may send (`$ref`, `anyOf`,
`pattern`, `format`, `minItems`, `additionalProperties: false`,
`const`, `not`, ...): whether each library compiles it, and whether a
library that compiles it lets a document through that the feature forbids
(a feature silently ignored: output claimed valid that is not).

    python benchmarks/bench_grammar.py --out benchmarks/results/bench-grammar

Needs the `structured` extra's candidates (`pip install llguidance xgrammar`).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

SCHEMAS: list[tuple[str, dict[str, Any], Any]] = [
    (
        "person",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0},
                "email": {"type": "string"},
            },
            "required": ["name", "age"],
        },
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"},
    ),
    (
        "order",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "qty": {"type": "integer"},
                            "price": {"type": "number"},
                        },
                        "required": ["sku", "qty", "price"],
                    },
                },
                "status": {"enum": ["open", "paid", "shipped"]},
            },
            "required": ["id", "items", "status"],
        },
        {
            "id": "ABC-1234",
            "items": [
                {"sku": "pen", "qty": 3, "price": 1.25},
                {"sku": "ink", "qty": 1, "price": 7.5},
            ],
            "status": "paid",
        },
    ),
    (
        "tree",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "label": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["label"],
                }
            },
            "$ref": "#/$defs/node",
        },
        {
            "label": "root",
            "children": [{"label": "a"}, {"label": "b", "children": [{"label": "c"}]}],
        },
    ),
    (
        "event",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "when": {"type": "string", "format": "date"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "private": {"type": "boolean"},
                "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            },
            "required": ["title", "when", "tags", "private", "score"],
            "additionalProperties": False,
        },
        {
            "title": "Launch",
            "when": "2026-12-02",
            "tags": ["x", "y"],
            "private": False,
            "score": None,
        },
    ),
]

FEATURES: dict[str, dict[str, Any]] = {
    "$ref": SCHEMAS[2][1],
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "pattern": {"type": "string", "pattern": "^[a-z]+[0-9]*$"},
    "format: date-time": {"type": "string", "format": "date-time"},
    "minItems/maxItems": {
        "type": "array",
        "items": {"type": "integer"},
        "minItems": 2,
        "maxItems": 4,
    },
    "additionalProperties: false": SCHEMAS[3][1],
    "const": {"type": "object", "properties": {"v": {"const": 2}}, "required": ["v"]},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    "not": {"not": {"type": "string"}},
}
# a document each feature forbids (compact JSON): a library that compiles the
# schema must not let it through
VIOLATIONS: dict[str, str] = {
    "pattern": '"ABC1"',
    "format: date-time": '"yesterday"',
    "minItems/maxItems": "[1]",
    "const": '{"v":3}',
    "minLength/maxLength": '"abcdefg"',
    "exclusiveMinimum": "0",
    "oneOf": '"x"',
    "not": '"abc"',
}

ROLLBACK = 4


class Library:
    """A grammar library behind the walk: each has `name`, `vocab`, a
    preallocated (1, ceil(V / 32)) int32 bitmask `bits`, and compile, fill,
    consume, accepting and forced; a matcher rolls back by `rollback(n)` in both."""

    bits: Any

    def fill(self, m: Any) -> None:
        raise NotImplementedError

    def mask(self, m: Any) -> np.ndarray:
        """The allowed tokens now, as a copy of the bitmask."""
        self.fill(m)
        return self.bits.numpy().copy()

    def rollback(self, m: Any, n: int) -> None:
        m.rollback(n)


class Llg(Library):
    name = "llguidance"

    def __init__(self, tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg, self.lt = llguidance, llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tokenizer)
        self.vocab = self.tok.vocab_size
        self.bits = llguidance.torch.allocate_token_bitmask(1, self.vocab)

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
        m = self.llg.LLMatcher(self.tok, grammar)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m: Any) -> None:
        self.lt.fill_next_token_bitmask(m, self.bits, 0)

    def consume(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def accepting(self, m: Any) -> bool:
        return bool(m.is_accepting())

    def forced(self, m: Any) -> list[int]:
        return list(m.compute_ff_tokens())


class Xgr(Library):
    name = "xgrammar"

    def __init__(self, tokenizer: Any) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2, cache_enabled=False)
        self.vocab = self.info.vocab_size
        self.bits = xgr.allocate_token_bitmask(1, self.vocab)

    def compile(self, schema: dict[str, Any]) -> Any:
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":")
        )
        return self.xgr.GrammarMatcher(compiled, max_rollback_tokens=64)

    def fill(self, m: Any) -> None:
        m.fill_next_token_bitmask(self.bits)

    def consume(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def accepting(self, m: Any) -> bool:
        return bool(m.is_terminated()) or self._accepts_eos(m)

    def _accepts_eos(self, m: Any) -> bool:
        bits = self.mask(m)
        return any(allowed(bits, t) for t in m.stop_token_ids)

    def forced(self, m: Any) -> list[int]:
        return []  # xgrammar offers a forced string (find_jump_forward_string), not tokens


def allowed(bits: np.ndarray, token: int) -> bool:
    """Whether `token` is set in a (1, ceil(V / 32)) int32 bitmask."""
    return bool((int(bits[0, token // 32]) >> (token % 32)) & 1)


def lets_through(lib: Any, schema: dict[str, Any], text: str, tokenizer: Any) -> bool:
    """Whether the library allows every token of `text` and accepts after it."""
    m = lib.compile(schema)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not allowed(lib.mask(m), token):
            return False
        lib.consume(m, token)
    return bool(lib.accepting(m))


def walk(lib: Any, schema: dict[str, Any], tokens: list[int], eos: int) -> dict[str, Any]:
    """One schema through one library (see the module docs)."""
    t0 = time.perf_counter()
    m = lib.compile(schema)
    compile_s = time.perf_counter() - t0
    forced = lib.forced(m)
    masks, times, ok = [], [], True
    for i, token in enumerate(tokens):
        t0 = time.perf_counter()
        lib.fill(m)  # the mask into a preallocated bitmask: what a round pays
        times.append(time.perf_counter() - t0)
        bits = lib.bits.numpy().copy()
        masks.append(bits)
        if not allowed(bits, token):
            ok = False
            print(f"  {lib.name}: token {i} ({token}) not allowed")
            break
        if i == len(tokens) - 1 and lib.accepting(m) and len(tokens) > 1:
            ok = False  # accepting one token early would let EOS cut the document
        lib.consume(m, token)
    accepts = ok and lib.accepting(m)
    eos_allowed = ok and allowed(lib.mask(m), eos)
    rollback_s, same = float("nan"), False
    if ok:
        t0 = time.perf_counter()
        lib.rollback(m, ROLLBACK)
        rollback_s = time.perf_counter() - t0
        same = True
        for j, token in enumerate(tokens[-ROLLBACK:]):
            same &= bool(np.array_equal(lib.mask(m), masks[len(tokens) - ROLLBACK + j]))
            lib.consume(m, token)
    return {
        "compile ms": 1e3 * compile_s,
        "tokens": len(tokens),
        "mask us median": 1e6 * statistics.median(times),
        "mask us p99": 1e6 * float(np.percentile(times, 99)),
        "document allowed": ok,
        "accepts at the end": accepts,
        "EOS allowed at the end": eos_allowed,
        f"rollback {ROLLBACK} us": 1e6 * rollback_s,
        "masks equal after rollback": same,
        "forced tokens at start": len(forced),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="walks per schema and library (medians)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    from specdec_rs.gguf.model import tokenizer_for
    from specdec_rs.models import smollm2_gguf

    tokenizer = tokenizer_for(smollm2_gguf(), Path(tempfile.gettempdir()) / "specdec-bench-grammar")
    eos = int(tokenizer.eos_token_id)
    libs: list[Any] = []
    setup: dict[str, float] = {}
    for cls in (Llg, Xgr):
        cls(tokenizer)  # the first in a process also loads the library's own parts
        t0 = time.perf_counter()
        libs.append(cls(tokenizer))
        setup[cls.name] = time.perf_counter() - t0
    print(f"host: {platform.processor() or platform.machine()}; vocab {len(tokenizer)}")
    for name, s in setup.items():
        print(f"{name}: tokenizer prepared in {s:.2f} s")
    rows: list[dict[str, Any]] = []
    for name, schema, doc in SCHEMAS:
        text = json.dumps(doc, separators=(",", ":"))
        tokens = tokenizer.encode(text, add_special_tokens=False)
        for lib in libs:
            walks = [walk(lib, schema, tokens, eos) for _ in range(args.repeats)]
            row = {"schema": name, "library": lib.name}
            for key in walks[0]:
                values = [w[key] for w in walks]
                row[key] = statistics.median(values) if isinstance(values[0], float) else values[0]
            rows.append(row)
            print(json.dumps(row))
    coverage: dict[str, dict[str, str]] = {}
    for feature, schema in FEATURES.items():
        coverage[feature] = {}
        for lib in libs:
            try:
                lib.compile(schema)
                coverage[feature][lib.name] = "compiles"
                bad = VIOLATIONS.get(feature)
                if bad is not None and lets_through(lib, schema, bad, tokenizer):
                    coverage[feature][lib.name] = f"compiles, but lets {bad} through"
            except Exception as e:  # noqa: BLE001 - each library raises its own types
                coverage[feature][lib.name] = f"refused: {str(e).splitlines()[0][:80]}"
        print(feature, coverage[feature])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(
            json.dumps({"setup s": setup, "rows": rows, "coverage": coverage}, indent=1)
        )


if __name__ == "__main__":
    main()
