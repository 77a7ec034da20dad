"""The structured-output fuzz through `specdec serve` (issue 38): JSON
schemas drawn by hypothesis-jsonschema from a meta-schema (nested objects,
arrays, enums, numbers, strings with patterns and formats, combinators,
$ref, and keywords a grammar library may not support), and malformed
`response_format` / `structured_outputs` bodies drawn by hypothesis.

Each request must end in a 200 or a 400 within its time limit: no 500, no
crash, no hang, and the server keeps serving. A 200 that finishes with
"stop" claims its text follows the schema, so it is parsed and validated
(`jsonschema`, formats checked); a "length" finish claims nothing.

    python tests/schema_fuzz.py --schemas 2000 --bodies 500   # the tally

The tests (tests/test_serve_fuzz.py) run the same checks: in the default
suite on 230 asks drawn once and stored (tests/data/schema_fuzz_corpus.json,
`--write-corpus`), drawn afresh at full size under `pytest -m fuzz`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

NAMES = ["id", "name", "age", "tags", "city", "kind", "items", "price", "ok", "note"]
PATTERNS = ["^[a-z]+$", "^[0-9]{3}-[0-9]{4}$", "^(yes|no)$", "[A-Z]", "^a(b|c)*d?$", "^.{2,5}$"]
FORMATS = ["date", "time", "date-time", "email", "uuid", "uri", "ipv4", "hostname", "regex"]
SCALAR = {"type": ["string", "integer", "boolean", "null"], "maxLength": 8}
SMALL = {"type": "integer", "minimum": 0, "maximum": 6}
TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]


def meta_schema(depth: int) -> dict[str, Any]:
    """A JSON schema whose instances are JSON schemas nested `depth` deep:
    every keyword optional, so the draws mix types and keywords freely
    (some meaningless together, some a library cannot compile)."""
    sub: dict[str, Any] = {"type": "boolean"} if depth == 0 else meta_schema(depth - 1)
    keywords: dict[str, Any] = {
        "type": {
            "anyOf": [
                {"enum": TYPES},
                {
                    "type": "array",
                    "items": {"enum": TYPES},
                    "minItems": 1,
                    "maxItems": 3,
                    "uniqueItems": True,
                },
            ]
        },
        "enum": {"type": "array", "items": SCALAR, "minItems": 1, "maxItems": 4},
        "const": SCALAR,
        "minimum": {"type": "integer", "minimum": -100, "maximum": 100},
        "maximum": {"type": "integer", "minimum": -100, "maximum": 1000},
        "exclusiveMinimum": {"type": "number", "minimum": -10, "maximum": 10},
        "multipleOf": {"enum": [1, 2, 5, 0.5]},
        "minLength": SMALL,
        "maxLength": {"type": "integer", "minimum": 0, "maximum": 20},
        "pattern": {"enum": PATTERNS},
        "format": {"enum": FORMATS},
        "minItems": SMALL,
        "maxItems": SMALL,
        "uniqueItems": {"type": "boolean"},
        "required": {"type": "array", "items": {"enum": NAMES}, "maxItems": 3},
        "minProperties": SMALL,
        "maxProperties": SMALL,
    }
    if depth > 0:
        keywords |= {
            "properties": {
                "type": "object",
                "propertyNames": {"enum": NAMES},
                "additionalProperties": sub,
                "maxProperties": 4,
            },
            "items": sub,
            "prefixItems": {"type": "array", "items": sub, "maxItems": 2},
            "additionalProperties": sub,
            "anyOf": {"type": "array", "items": sub, "minItems": 1, "maxItems": 3},
            "oneOf": {"type": "array", "items": sub, "minItems": 1, "maxItems": 2},
            "allOf": {"type": "array", "items": sub, "minItems": 1, "maxItems": 2},
            "not": sub,
            "contains": sub,
            "if": sub,
            "then": sub,
            "patternProperties": {
                "type": "object",
                "propertyNames": {"enum": ["^x", "^[a-z]+$"]},
                "additionalProperties": sub,
                "maxProperties": 1,
            },
        }
    return {
        "type": "object",
        "properties": keywords,
        "additionalProperties": False,
        "maxProperties": 5,
    }


SCHEMAS = from_schema(meta_schema(2))

# JSON text can hold: no NaN or infinity, no lone surrogates
TEXT = st.characters(blacklist_categories=("Cs",))
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(TEXT, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "type",
        "json_schema",
        "schema",
        "name",
        "strict",
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
    ]
)


@st.composite
def malformed(draw: st.DrawFn) -> dict[str, Any]:
    """A chat body whose response_format or structured_outputs is malformed:
    a random JSON value, a real shape with random parts, or both fields."""
    junk = draw(JSON)
    part = draw(st.dictionaries(KEYS, JSON, max_size=3))
    shape = draw(
        st.sampled_from(
            [
                {"response_format": junk},
                {"response_format": {"type": draw(st.text(TEXT, max_size=12)), **part}},
                {"response_format": {"type": "json_schema", "json_schema": junk}},
                {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": junk},
                    }
                },
                {"structured_outputs": junk},
                {"structured_outputs": part},
                {"structured_outputs": {"regex": draw(st.text(TEXT, max_size=12))}},
                {"structured_outputs": {"grammar": draw(st.text(TEXT, max_size=30))}},
                {"structured_outputs": {"choice": junk}},
                {"response_format": {"type": "json_object"}, "structured_outputs": part},
            ]
        )
    )
    return shape


@dataclass
class Tally:
    """What the fuzz saw: outcomes by kind, and every broken promise."""

    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)  # a 400's message, its first words

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items()))
        return f"{sum(self.outcomes.values())} requests: {kinds}; {len(self.failures)} failures"


MESSAGES = [{"role": "user", "content": "Answer in JSON."}]


def ask(
    http: httpx.Client, body: dict[str, Any], tally: Tally, kind: str, schema: Any = None
) -> None:
    """Post one chat body and check the promise: a 200 or a 400, and a 200
    that stops by the grammar validates under `schema` (when given)."""
    try:
        r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, **body})
    except httpx.TimeoutException:
        tally.outcomes["timeout"] += 1
        tally.failures.append(f"no answer in time for {json.dumps(body)[:300]}")
        return
    if r.status_code == 400:
        tally.outcomes[f"{kind}: 400"] += 1
        message = r.json()["error"]["message"]
        tally.refusals[" ".join(message.split()[:14])] += 1
        return
    if r.status_code != 200:
        tally.outcomes[f"{kind}: {r.status_code}"] += 1
        tally.failures.append(f"{r.status_code} for {json.dumps(body)[:300]}: {r.text[:300]}")
        return
    choice = r.json()["choices"][0]
    finish = choice["finish_reason"]
    tally.outcomes[f"{kind}: 200 {finish}"] += 1
    if finish != "stop" or schema is None:
        return
    text = choice["message"]["content"]
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls(schema, format_checker=cls.FORMAT_CHECKER).validate(json.loads(text))
    except (ValueError, jsonschema.ValidationError) as e:
        tally.failures.append(
            f"stopped but invalid: {text!r} under {json.dumps(schema)}: {e}"[:600]
        )


Ask = tuple[str, dict[str, Any]]  # ("schema" | "malformed", the body's fields past the messages)
CORPUS = Path(__file__).parent / "data" / "schema_fuzz_corpus.json"
DRAFTERS = ["none", "prompt-lookup", "suffix"]


def draw(n_schemas: int, n_bodies: int, max_tokens: int = 24) -> list[Ask]:
    """`n_schemas` drawn schemas (as response_format json_schema, at T = 0
    or 0.7, drafter none, prompt lookup or suffix) and `n_bodies` malformed
    bodies; derandomized, so fixed per count (and per hypothesis version)."""
    asks: list[Ask] = []
    options = settings(
        max_examples=1,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )

    @settings(options, max_examples=n_schemas)
    @given(schema=SCHEMAS, i=st.integers(0, 5))
    def one_schema(schema: dict[str, Any], i: int) -> None:
        body = {
            "max_tokens": max_tokens,
            "temperature": 0.7 * (i % 2),
            "seed": i,
            "speculation": {"drafter": DRAFTERS[i % 3]},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        }
        asks.append(("schema", body))

    @settings(options, max_examples=n_bodies)
    @given(body=malformed())
    def one_body(body: dict[str, Any]) -> None:
        asks.append(("malformed", {"max_tokens": 8, **body}))

    if n_schemas:
        one_schema()
    if n_bodies:
        one_body()
    return asks


def corpus() -> list[Ask]:
    """The default suite's asks: `draw(150, 80)` stored as drawn (drawing
    them takes hypothesis-jsonschema ~17 s on two cores; the server's
    answers to them take ~2 s). `python tests/schema_fuzz.py --write-corpus`
    draws them again."""
    return [(a["kind"], a["body"]) for a in json.loads(CORPUS.read_text())]


def fuzz(url: str, asks: list[Ask], timeout: float = 60.0) -> Tally:
    """Send each ask as a chat body to the server at `url` and tally the
    answers; then check that the server still serves."""
    tally = Tally()
    with httpx.Client(base_url=url, timeout=timeout) as http:
        for kind, body in asks:
            schema = body["response_format"]["json_schema"]["schema"] if kind == "schema" else None
            ask(http, body, tally, kind, schema)
        r = http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4}
        )
        if r.status_code != 200:
            tally.failures.append(f"the server stopped serving: {r.status_code} {r.text[:200]}")
    return tally


def main() -> None:
    import argparse
    import sys
    from tempfile import mkdtemp

    sys.path.insert(0, str(Path(__file__).parent))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", type=int, default=2000)
    parser.add_argument("--bodies", type=int, default=500)
    parser.add_argument(
        "--write-corpus",
        action="store_true",
        help=f"store the draws of 150 schemas and 80 bodies in {CORPUS.name} (no server)",
    )
    args = parser.parse_args()
    if args.write_corpus:
        asks = [{"kind": kind, "body": body} for kind, body in draw(150, 80)]
        CORPUS.parent.mkdir(exist_ok=True)
        CORPUS.write_text(json.dumps(asks, indent=None, separators=(",", ":")) + "\n")
        print(f"{len(asks)} asks written to {CORPUS}")
        return
    from serve_fixtures import save_model, serve

    bg = serve(save_model(Path(mkdtemp())), max_batch=4, drafters=("none", "suffix"))
    try:
        tally = fuzz(bg.url, draw(args.schemas, args.bodies))
    finally:
        bg.stop()
    print(tally.summary())
    for message, n in tally.refusals.most_common(40):
        print(f"  400 x{n}: {message}")
    for failure in tally.failures:
        print(" -", failure)


if __name__ == "__main__":
    main()
