"""Structured output through `specdec serve`: OpenAI's response_format
(json_object, json_schema) and vLLM's structured_outputs on both endpoints,
with the official `openai` client; the refusals (a 400 naming the problem,
and the server goes on). A 2-layer random Llama over SmolLM2's tokenizer
serves. p = target, q = draft."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_fixtures import HTTP, client, model_folder, serve
from specdec_rs.serve.server import Background

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

__all__ = ["model_folder"]  # a fixture: imported to be found, not called

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 10**7},
        "coastal": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["old", "new"]}, "maxItems": 2},
    },
    "required": ["city", "population", "coastal", "tags"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]


@pytest.fixture(scope="module")
def server(model_folder: Path) -> Iterator[Background]:
    bg = serve(model_folder, max_batch=4, drafters=("none", "suffix"))
    yield bg
    bg.stop()


@pytest.mark.parametrize("drafter", ["prompt-lookup", "none", "suffix"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_json_schema_chat_answer_validates(
    server: Background, drafter: str, temperature: float
) -> None:
    out = client(server).chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=120,
        temperature=temperature,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}},
        extra_body={"speculation": {"drafter": drafter}},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_greedy_structured_output_is_the_same_with_and_without_drafts(server: Background) -> None:
    texts = set()
    for drafter in ("prompt-lookup", "none", "suffix"):
        out = client(server).completions.create(
            model="tiny",
            prompt="A city:",
            max_tokens=120,
            temperature=0,
            extra_body={
                "structured_outputs": {"json": SCHEMA},
                "speculation": {"drafter": drafter},
            },
        )
        texts.add(out.choices[0].text)
    assert len(texts) == 1


def test_json_object_choice_regex_and_grammar_on_both_endpoints(server: Background) -> None:
    c = client(server)
    out = c.completions.create(
        model="tiny",
        prompt="Pick:",
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
    )
    assert out.choices[0].text in {"red", "green", "blue"}
    out = c.completions.create(
        model="tiny",
        prompt="A date:",
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-(0[1-9]|1[0-2])"}},
    )
    assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])", out.choices[0].text)
    out = c.completions.create(
        model="tiny",
        prompt="Yes or no:",
        max_tokens=20,
        extra_body={"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}},
    )
    assert out.choices[0].text in {"yes", "no"}
    chat = c.chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(chat.choices[0].message.content or ""), dict)


def test_a_budget_that_ends_first_is_finish_reason_length(server: Background) -> None:
    out = client(server).chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=3,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    )
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].message.content and out.choices[0].message.content.startswith('{"')


BAD: list[tuple[dict[str, Any], str, str | None]] = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"not": {}}},
            }
        },
        '"not"',
        "response_format",
    ),
    ({"response_format": {"type": "json_schema"}}, "goes with", None),
    ({"response_format": {"type": "xml"}}, "response_format", None),
    ({"structured_outputs": {"regex": "("}}, "unclosed group", "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one", None),
    ({"structured_outputs": {}}, "exactly one", None),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "whitespace_pattern", None),
    ({"structured_outputs": {"choice": []}}, "1 to", "structured_outputs"),
    ({"structured_outputs": {"json": "{bad"}}, "not valid JSON", "structured_outputs"),
    ({"structured_outputs": {"grammar": "start: nothing"}}, "unknown name", "structured_outputs"),
    (
        {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
        "not both",
        None,
    ),
    ({"structured_outputs": {"regex": "a"}, "ignore_eos": True}, "ignore_eos", None),
]


@pytest.mark.parametrize(("extra", "says", "param"), BAD)
def test_an_unsupported_constraint_is_a_400_and_the_server_goes_on(
    server: Background, extra: dict[str, Any], says: str, param: str | None
) -> None:
    for endpoint, body in (
        ("completions", {"prompt": "x", "max_tokens": 4}),
        ("chat/completions", {"messages": MESSAGES, "max_tokens": 4}),
    ):
        r = HTTP.post(f"{server.url}/v1/{endpoint}", json={**body, **extra})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert says in error["message"], error
        if param is not None:
            assert error["param"] == param
    ok = client(server).completions.create(model="tiny", prompt="go on", max_tokens=2)
    assert ok.usage is not None and ok.usage.completion_tokens == 2


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_a_grammar_the_tokenizer_cannot_follow_is_a_400_streamed_or_not(
    server: Background, drafter: str
) -> None:
    """U+63A19 starts with the byte F1, which no token of SmolLM2's
    vocabulary holds: the regex cannot be followed mid-generation (found
    by the fuzz, tests/schema_fuzz.py). A 400, or an error event when
    streamed; then the server goes on."""
    body = {
        "messages": MESSAGES,
        "max_tokens": 8,
        "structured_outputs": {"regex": "ab\U00063a19c"},
        "speculation": {"drafter": drafter},
    }
    r = HTTP.post(f"{server.url}/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert "no tokenization" in r.json()["error"]["message"]
    streamed = {**body, "stream": True}
    with HTTP.stream("POST", f"{server.url}/v1/chat/completions", json=streamed) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["type"] == "invalid_request_error" and "no tokenization" in error["message"]
    assert events[-1] == "data: [DONE]"
    ok = client(server).completions.create(model="tiny", prompt="go on", max_tokens=2)
    assert ok.usage is not None and ok.usage.completion_tokens == 2
