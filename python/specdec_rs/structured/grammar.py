"""`Grammar`: what the output must match, independent of any tokenizer.

Five kinds, as the OpenAI API and vLLM name them: a JSON schema
(``response_format`` ``json_schema``), any JSON object (``json_object``), a
regular expression, a choice among fixed strings, and a context-free
grammar (Lark, or llama.cpp's GBNF, converted to Lark). Each becomes one
llguidance grammar (`llguidance_grammar`), checked when it is made: an
unsupported schema keyword or a bad regex is a ValueError that names it.

JSON is compact (no whitespace between tokens, ``", "`` and ``": "`` not
allowed), so a schema's forced runs (keys, braces) are long and the output
is what ``json.dumps(..., separators=(",", ":"))`` writes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

Kind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
# the JSON compiler's options: compact JSON, and keys in the schema's order
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
MAX_CHOICES = 10_000
MAX_SOURCE = 1 << 20  # characters of a schema, regex or grammar


@dataclass(frozen=True)
class Grammar:
    """kind: one of `Kind`; source: the schema as JSON text, the regex, the
    choices as a JSON list, or the Lark grammar. Build one with the class
    methods; `llguidance_grammar` is what the matcher reads (made once)."""

    kind: Kind
    source: str

    @classmethod
    def json_schema(cls, schema: Any) -> Grammar:
        """A JSON schema (a dict, or its JSON text). ValueError for text
        that is not JSON, a schema that is not an object, or a keyword the
        grammar compiler does not implement (named in the message)."""
        if isinstance(schema, str):
            text = _bounded(schema, "json_schema")
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"json_schema is not valid JSON ({error.msg} at line {error.lineno}, "
                    f"column {error.colno}); pass a JSON object such as "
                    '{"type": "object", "properties": {...}}'
                ) from None
        if schema is True:
            schema = {}
        if schema is False:
            raise ValueError("json_schema is false: it matches nothing; pass a schema object")
        if not isinstance(schema, dict):
            raise ValueError(
                f"json_schema is a {type(schema).__name__}; expected a JSON object (a dict) "
                'such as {"type": "object", "properties": {...}}'
            )
        try:
            text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"json_schema cannot be written as JSON: {error}") from None
        _check_exact_integers(schema, "json_schema")
        return _checked(cls("json_schema", _bounded(text, "json_schema")))

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (``response_format: {"type": "json_object"}``)."""
        return _checked(cls("json_object", '{"type": "object"}'))

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """The whole output matches `pattern` (Rust `regex` syntax: no
        look-around, no back-references)."""
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"regex = {pattern!r}; expected a non-empty pattern string")
        return _checked(cls("regex", _bounded(pattern, "regex")))

    @classmethod
    def choice(cls, options: Sequence[str]) -> Grammar:
        """The output is exactly one of `options` (non-empty strings)."""
        if isinstance(options, str) or not isinstance(options, Sequence):
            raise ValueError(
                f"choice is a {type(options).__name__}; expected a list of strings, "
                'e.g. ["yes", "no"]'
            )
        items = list(options)
        if not 1 <= len(items) <= MAX_CHOICES:
            raise ValueError(f"choice has {len(items)} options; expected 1 to {MAX_CHOICES}")
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item:
                raise ValueError(f"choice option {i} is {item!r}; expected a non-empty string")
        return _checked(cls("choice", _bounded(json.dumps(items, ensure_ascii=False), "choice")))

    @classmethod
    def grammar(cls, text: str) -> Grammar:
        """A context-free grammar: Lark (llguidance's dialect, ``start:``
        the top rule) or GBNF (llama.cpp's, ``root ::= ...``; converted)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"grammar = {text!r}; expected a Lark or GBNF grammar text")
        text = _bounded(text, "grammar")
        if re.search(r"^\s*root\s*::=", text, re.MULTILINE):
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                text = gbnf_to_lark(text)
            except Exception as error:  # the converter raises plain exceptions
                raise ValueError(f"grammar: the GBNF text does not convert: {error}") from None
        return _checked(cls("grammar", text))

    @property
    def options(self) -> list[str]:
        """A choice's options (ValueError for another kind)."""
        if self.kind != "choice":
            raise ValueError(f"a {self.kind} grammar has no options")
        out: list[str] = json.loads(self.source)
        return out

    @functools.cached_property
    def llguidance_grammar(self) -> str:
        """The grammar as llguidance's matcher reads it."""
        from llguidance import LLMatcher

        if self.kind in ("json_schema", "json_object"):
            return str(LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS))
        if self.kind == "regex":
            return str(LLMatcher.grammar_from_regex(self.source))
        if self.kind == "choice":
            return str(LLMatcher.grammar_from_regex("|".join(map(re.escape, self.options))))
        return str(LLMatcher.grammar_from_lark(self.source))


def _bounded(text: str, what: str) -> str:
    if len(text) > MAX_SOURCE:
        raise ValueError(f"{what} is {len(text):,} characters long; the limit is {MAX_SOURCE:,}")
    return text


def _checked(grammar: Grammar) -> Grammar:
    """`grammar`, or a ValueError with the compiler's message (an
    unsupported keyword, a bad regex, an unknown rule)."""
    from llguidance import LLMatcher

    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar.llguidance_grammar)
    if failed:
        message = messages[0].strip() if messages else "no message"
        if "coerce_one_of" in message:  # the library's option, not one a request can set
            message = (
                "oneOf whose branches may overlap is not supported (exactly one must match); "
                "use anyOf if any branch will do"
            )
        hint = {
            "json_schema": "drop or rewrite that part of the schema",
            "regex": "use Rust regex syntax (no look-around or back-references)",
            "grammar": "check the rule names and the start rule",
        }.get(grammar.kind, "check the input")
        raise ValueError(f"{grammar.kind} is not supported as given: {message}; {hint}")
    return grammar


EXACT_INTEGER = 2**53  # beyond it a float64 (the grammar compiler's number) skips integers
# the keywords whose numbers the output must meet exactly
NUMBER_KEYWORDS = frozenset(
    {"enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)


def _check_exact_integers(node: Any, where: str, keyword: str | None = None) -> None:
    """ValueError for an integer beyond ±2^53 in a schema's enum or const,
    or a bound there that a float64 cannot hold: the compiler holds numbers
    as float64, so it would require a neighbour of the number asked for
    (the fuzz found it: an enum of 2^60 + 1 gave 2^60)."""
    if isinstance(node, dict):
        for key, value in node.items():  # an enum's or const's objects are data: all checked
            inner = keyword if keyword in ("enum", "const") else None
            if inner is None and key in NUMBER_KEYWORDS:
                inner = key
            _check_exact_integers(value, f"{where}.{key}", inner)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_exact_integers(value, f"{where}[{i}]", keyword)
    elif (
        keyword is not None
        and isinstance(node, int)
        and not isinstance(node, bool)
        and abs(node) > EXACT_INTEGER
        # a bound a float64 holds exactly is met exactly; an enum's or const's
        # integer is written back as the float's shortest text, another number
        and (keyword in ("enum", "const") or int(float(node)) != node)
    ):
        raise ValueError(
            f"{where} = {node}: integers beyond ±2^53 ({EXACT_INTEGER}) are not exact in the "
            "grammar compiler, which would require a neighbouring number; give the value as "
            "a string or a number within that range"
        )
