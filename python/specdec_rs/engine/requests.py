"""A request to the batch engine, its checks at submission (once), and what
leaves the engine. p = target, q = draft, k = γ."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.generation.inputs import Prompt, check_context, eos_set
from specdec_rs.generation.loop import constrained
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.policy.base import MAX_K
from specdec_rs.processors import SamplingConfig

if TYPE_CHECKING:
    from specdec_rs.drafters import Drafter
    from specdec_rs.generation.result import GenerationResult
    from specdec_rs.structured import Constraint, Grammar

Factory = Callable[[], "Drafter | None"]


@dataclass(frozen=True)
class Request:
    """One sequence to generate: its prompt (token ids) and its settings.
    k: this row's γ (0: no drafts); None takes the engine's (its `k`, or
    its batch policy's choice each round). seed None: drawn at submission.
    drafter: the name of one of the engine's `drafters` ("none": target
    only); None takes the engine's `drafter_factory`. grammar: constrain
    this row's output (`structured.Grammar`; the engine needs `tokenizer`)."""

    prompt: Any
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    eos_token_id: int | Iterable[int] | None = None
    k: int | None = None
    drafter: str | None = None
    grammar: Grammar | None = None


@dataclass(frozen=True)
class Finished:
    """A request that left the batch: its id (`BatchEngine.submit`'s), and
    its result, or the error that ended it (then result is None). refused:
    the error is the request's own (its grammar cannot be followed by this
    model's tokenizer), not the engine's."""

    id: int
    result: GenerationResult | None
    error: str | None = None
    refused: bool = False


@dataclass(frozen=True)
class Checked:
    """A request after its checks (submission time): the prompt (checked
    here once: its row's `Decoder` takes it as it is), the budget, the
    processors, the seed, the stop ids, its own γ (None: the engine's), its
    drafter factory (None: target only) and its grammar's state."""

    id: int
    prompt: Prompt
    max_new: int
    config: SamplingConfig
    seed: int
    eos: frozenset[int]
    k: int | None
    factory: Factory | None
    constraint: Constraint | None = None


@dataclass(frozen=True)
class Admission:
    """What a request is checked against: the target, its vocabulary, the
    engine's drafter factories (`default` and by name), its tokenizer (for
    grammars), whether past-context prompts are allowed, and the positions
    the engine's caches hold."""

    target: Any
    vocab: int
    default: Factory | None
    drafters: Mapping[str, Factory | None]
    tokenizer: Any
    allow_past_context: bool
    cache_positions: int

    def check(self, request: Request, rid: int, where: str | None = None) -> Checked:
        """`request` checked and converted as it would be queued with id
        `rid` (ValueError naming `where`, default "request <rid>")."""
        where = where or f"request {rid}"
        if not isinstance(request, Request):
            raise ValueError(f"{where} is a {type(request).__name__}; pass an engine.Request")
        try:
            prompt = Prompt.of(request.prompt, self.vocab)
            max_new = _checks.integer(
                request.max_new_tokens, "max_new_tokens", minimum=1, maximum=MAX_NEW_TOKENS
            )
            check_context(self.target, len(prompt), max_new, self.allow_past_context)
            config = SamplingConfig(
                request.temperature, request.top_k, request.top_p, request.min_p
            )
            seed = secrets.randbits(63) if request.seed is None else _checks.seed(request.seed)
            eos = eos_set(request.eos_token_id, self.target)
            k = (
                None
                if request.k is None
                else _checks.integer(request.k, "k", minimum=0, maximum=MAX_K)
            )
            factory = self.factory(request.drafter)
            constraint = constrained(request.grammar, self.tokenizer_for(request), self.vocab, eos)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        need = len(prompt) + max_new
        if need > self.cache_positions:
            raise ValueError(
                f"{where} needs {need} cache positions (a prompt of {len(prompt)} + "
                f"max_new_tokens {max_new}), more than the engine's cache holds "
                f"(cache_positions = {self.cache_positions}); shorten it or raise cache_positions"
            )
        return Checked(rid, prompt, max_new, config, seed, eos, k, factory, constraint)

    def tokenizer_for(self, request: Request) -> Any:
        """The engine's tokenizer for a request with a grammar (None without)."""
        if request.grammar is not None and self.tokenizer is None:
            raise ValueError(
                "the request has a grammar, but the engine has no tokenizer to read it "
                "with: build the BatchEngine with tokenizer="
            )
        return None if request.grammar is None else self.tokenizer

    def factory(self, name: Any) -> Factory | None:
        """The drafter factory a request names (None: the engine's)."""
        if name is None:
            return self.default
        if not isinstance(name, str) or name not in self.drafters:
            raise ValueError(
                f"drafter {name!r} is not one of this engine's drafters "
                f"({', '.join(sorted(self.drafters))}); pick one of those or None"
            )
        return self.drafters[name]


def named_factories(drafters: Mapping[str, Factory | None] | None) -> dict[str, Factory | None]:
    """{name: factory}, checked, with "none" (target only) added."""
    if drafters is None:
        drafters = {}
    if not isinstance(drafters, Mapping):
        raise ValueError(
            f"drafters is a {type(drafters).__name__}; pass a dict of name -> drafter factory"
        )
    out: dict[str, Factory | None] = {"none": None}
    for name, factory in drafters.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"drafters has the key {name!r}; name each factory by a string")
        if factory is not None:
            _checks.function(factory, f"drafters[{name!r}]")
        out[name] = factory
    return out
