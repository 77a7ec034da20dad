"""Drafters by command-line name: ``kind`` or ``kind:ARG``. A drafter class
registers itself once (`@register`) and builds itself from its argument
(`from_spec`); the CLI, `measure` and the benchmarks only call `from_spec`.
A class may also check its argument without a model (`check_spec(arg)`:
options, a file's contents), which `parse_spec` runs, so a bad spec fails
before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

Arg = Literal["layers", "path", "optional-path", "optional-text"] | None

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    kind: str
    arg: Arg
    help: str
    build: Callable[[Any, Any, Any, bool], Any]  # (arg, target, tokenizer, greedy) -> drafter
    check: Callable[[Any], None] | None = None  # (arg) -> None, or a ValueError

    @property
    def usage(self) -> str:
        return (
            self.kind
            + {
                "layers": ":L",
                "path": ":PATH",
                "optional-path": "[:PATH]",
                "optional-text": "[:OPTIONS]",
                None: "",
            }[self.arg]
        )


REGISTRY: dict[str, Entry] = {}


def register(kind: str, *, arg: Arg, help: str) -> Callable[[T], T]:
    """Class decorator: the class's ``from_spec(arg, target, tokenizer, greedy)``
    builds it from ``kind[:arg]``."""

    def add(cls: T) -> T:
        check = getattr(cls, "check_spec", None)
        REGISTRY[kind] = Entry(kind, arg, help, cls.from_spec, check)  # type: ignore[attr-defined]
        return cls

    return add


REGISTRY["none"] = Entry("none", None, "target only (no drafter)", lambda *_: None)


def spec_help() -> str:
    """One line per registered drafter, for --help texts and error messages."""
    return "; ".join(f"{e.usage} ({e.help})" for e in REGISTRY.values())


def parse_spec(spec: Any) -> tuple[Entry, Any]:
    """(entry, argument) of a spec, checked without building anything:
    ``early-exit:24`` -> (early-exit, 24), ``eagle`` -> (eagle, None);
    ValueError for an unknown or
    malformed spec."""
    parsed = _parse(spec)
    if parsed is None:
        raise ValueError(f"drafter {spec!r} is not understood; expected one of: {spec_help()}")
    entry, arg = parsed
    if entry.check is not None and arg is not None:
        try:
            entry.check(arg)
        except ValueError as e:
            raise ValueError(f"drafter {spec!r}: {e}") from None
    return entry, arg


def _parse(spec: Any) -> tuple[Entry, Any] | None:
    if not isinstance(spec, str):
        return None
    kind, sep, raw = spec.partition(":")
    entry = REGISTRY.get(kind)
    if entry is None:
        return None
    if entry.arg is None and not sep:
        return entry, None
    if entry.arg == "layers" and raw.isascii() and raw.isdigit():
        return entry, int(raw)
    if entry.arg == "path" and raw:
        return entry, raw
    if entry.arg in ("optional-path", "optional-text") and (raw or not sep):
        return entry, raw or None
    return None


def split_specs(text: str) -> list[str]:
    """The specs of a comma-separated list (``--drafters``): a comma starts
    a new spec only before a registered kind, so a spec's own commas stay in
    it (``lookahead:2,3,2,suffix`` is ``lookahead:2,3,2`` and ``suffix``)."""
    out: list[str] = []
    for piece in text.split(","):
        if not piece.strip():
            continue
        kind = piece.strip().partition(":")[0]
        if out and kind not in REGISTRY:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return [s.strip() for s in out if s.strip()]


def from_spec(spec: str, target: Any, tokenizer: Any = None, *, greedy: bool = False) -> Any:
    """The drafter a spec names, built for `target` (None for ``none``).
    `tokenizer` is needed by drafters that load a model (to compare vocabularies)."""
    entry, arg = parse_spec(spec)
    return entry.build(arg, target, tokenizer, greedy)
