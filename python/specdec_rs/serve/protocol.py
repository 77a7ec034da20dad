"""The OpenAI request bodies `specdec serve` takes, checked by pydantic, and
the error body it answers with. p = target, q = draft, k = γ.

Strict types (a string where a number belongs is refused, not converted);
an unknown field is refused; a field that would change the output's law
(penalties, logit_bias, logprobs, best_of, n > 1) is refused unless it is
at its neutral value, so nothing is silently ignored. Extensions beside
OpenAI's fields: `top_k`, `min_p`, `ignore_eos`, `speculation`
({"drafter": name, "k": γ}; k = 0 or drafter "none" switches it off), and
vLLM's `structured_outputs` ({"json" | "regex" | "choice" | "grammar" |
"json_object": ...}); `response_format` (OpenAI's json_object and
json_schema) is taken by both endpoints, as vLLM does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specdec_rs.limits import MAX_NEW_TOKENS, MAX_TOP_K
from specdec_rs.policy.base import MAX_K
from specdec_rs.serve.text import MAX_STOP_CHARS, MAX_STOPS

if TYPE_CHECKING:
    from specdec_rs.structured import Grammar

MAX_SEED = 2**63 - 1


def _utf8(text: str) -> str:
    """Text that encodes as UTF-8 (a JSON "\\ud800" is a lone surrogate,
    which no tokenizer takes)."""
    from specdec_rs._checks import utf8_text

    return utf8_text(text, "the text")


Text = Annotated[str, AfterValidator(_utf8)]
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS), AfterValidator(_utf8)]


class Speculation(BaseModel):
    """Per-request speculation: `drafter` names one of the server's
    drafters ("none": off), `k` fixes γ (0: off; omitted: the server's
    policy, e.g. the load-aware goodput γ)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    drafter: str | None = None
    k: Annotated[int, Field(ge=0, le=MAX_K)] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema: the schema and its name."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=64)]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: plain text, any JSON object, or JSON valid
    under a schema."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError(
                'response_format.json_schema goes with (and only with) type "json_schema"'
            )
        return self


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: exactly one of json (a schema), regex,
    choice, grammar (Lark or GBNF) or json_object (true)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def exactly_one(self) -> StructuredOutputs:
        given = [
            name
            for name, value in (
                ("json", self.json_),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
                ("json_object", self.json_object or None),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs takes exactly one of json, regex, choice, grammar or "
                f"json_object: true (given: {', '.join(given) or 'none'})"
            )
        return self


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOP_K)] | None = None  # -1, 0: off
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)] | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Annotated[dict[str, Any], Field(max_length=0)] | None = None
    ignore_eos: bool = False
    speculation: Speculation | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    @field_validator("stream_options")
    @classmethod
    def stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        """As OpenAI: stream_options only with stream: true (never ignored)."""
        if value is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed with stream: true")
        return value

    @model_validator(mode="after")
    def one_constraint(self) -> Sampling:
        """At most one of response_format (other than text) and
        structured_outputs; a grammar needs the EOS it ends on."""
        constrained = self.response_format is not None and self.response_format.type != "text"
        if constrained and self.structured_outputs is not None:
            raise ValueError("give response_format or structured_outputs, not both")
        if (constrained or self.structured_outputs is not None) and self.ignore_eos:
            raise ValueError(
                "ignore_eos: a constrained output ends with the EOS its grammar allows; "
                "drop ignore_eos or the constraint"
            )
        return self

    @model_validator(mode="after")
    def no_penalties(self) -> Sampling:
        """Penalties change the law the output is sampled from; this server
        serves the model's own distribution exactly."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ValueError(
                    f"{name} = {getattr(self, name)} would change the distribution served; "
                    "this server samples the model's own law exactly: send 0 or leave it out"
                )
        return self

    def grammar(self) -> Grammar | None:
        """The grammar the body asks for, or None for free text. ValueError
        (from `structured.Grammar`) for a schema, regex or grammar it cannot
        compile, naming the problem."""
        from specdec_rs.structured import Grammar

        f, so = self.response_format, self.structured_outputs
        if f is not None and f.type == "json_object":
            return Grammar.json_object()
        if f is not None and f.json_schema is not None:
            schema = f.json_schema.schema_
            return Grammar.json_schema({} if schema is None else schema)
        if so is None:
            return None
        if so.json_ is not None:
            return Grammar.json_schema(so.json_)
        if so.regex is not None:
            return Grammar.regex(so.regex)
        if so.choice is not None:
            return Grammar.choice(so.choice)
        if so.grammar is not None:
            return Grammar.grammar(so.grammar)
        return Grammar.json_object()

    @property
    def stops(self) -> list[str]:
        """The stop strings (empty ones dropped)."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def top_k_or_none(self) -> int | None:
        return None if self.top_k is None or self.top_k <= 0 else self.top_k

    @property
    def top_p_or_none(self) -> float | None:
        return None if self.top_p is None or self.top_p == 1.0 else self.top_p


Budget = Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)]


class CompletionRequest(Sampling):
    """POST /v1/completions: `prompt` is a string or a list of token ids
    (one prompt per request)."""

    prompt: Text | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    max_tokens: Budget | None = 16
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None
    logprobs: Literal[0] | None = None
    suffix: Literal[""] | None = None

    @model_validator(mode="before")
    @classmethod
    def one_prompt(cls, data: Any) -> Any:
        """A list of one string is that string; more is refused (send one
        request per prompt: they are batched together anyway)."""
        if isinstance(data, dict):
            prompt = data.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
                if len(prompt) > 1:
                    raise ValueError(
                        f"prompt holds {len(prompt)} strings; send one prompt per request "
                        "(concurrent requests share the batch)"
                    )
                data = {**data, "prompt": prompt[0]}
            if "prompt" not in data:
                raise ValueError("prompt is missing; pass a string or a list of token ids")
        return data


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: Text


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: str | None = None

    def turn(self) -> dict[str, str]:
        """{"role", "content"} for the chat template ("developer" is "system")."""
        text = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(Sampling):
    """POST /v1/chat/completions: `messages` through the model's chat template."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Budget | None = None
    max_completion_tokens: Budget | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: Literal[0] | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: Any = None
) -> dict[str, Any]:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(error: ValidationError | Any) -> tuple[str, str | None]:
    """(one line naming every refused field and why, the first field's name)."""
    errors = error.errors() if hasattr(error, "errors") else []
    parts, first = [], None
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
        # pydantic names the union member it tried ("str", "list[int]"); keep the field path
        path = ".".join(x for x in loc if not _is_type_name(x)) or "body"
        first = first or path
        parts.append(f"{path}: {e.get('msg', 'invalid')}")
    seen = list(dict.fromkeys(parts))
    return ("; ".join(seen) or "the request body is not valid", first)


def _is_type_name(part: str) -> bool:
    return part in ("str", "int", "float", "bool") or "[" in part or part.startswith("literal")
