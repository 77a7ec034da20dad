"""A multi-request workload that repeats as real traffic does, built from
the training prompts (`prompts.training`, disjoint from the evaluation
workloads): each code task asked twice, the second time with a small edit
to its wording, and chat conversations whose follow-up turn quotes the
model's first answer. Run in order through one drafter object (as a
server's requests share it), so a drafter that learns across requests can
reuse the earlier outputs. p = target, q = draft, k = γ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.rounds import Tally

if TYPE_CHECKING:
    from specdec_rs.generation import GenerationResult

FOLLOW_UP = 'You wrote: "{quote}". Explain that part again, in more detail.'
EDITS = (
    ("this function", "the function below"),
    ("Write", "Please write"),
    ("Explain", "Describe"),
)


def edited(prompt: str) -> str:
    """The prompt with a small edit to its wording (the first edit that applies)."""
    for old, new in EDITS:
        if old in prompt:
            return prompt.replace(old, new, 1)
    return "Please: " + prompt


def quote(answer: str, limit: int = 160) -> str:
    """The answer's first sentence (at most `limit` characters)."""
    text = " ".join(answer.split())
    end = min((i for i in (text.find(". "), text.find("\n")) if i > 0), default=len(text))
    return text[: min(end + 1, limit)].strip()


@dataclass(frozen=True)
class Asked:
    """One request of the workload: its kind ("code" or "chat"), whether it
    repeats an earlier one, the messages sent, and the result."""

    kind: str
    repeat: bool
    messages: list[dict[str, str]]
    result: GenerationResult


def run_repeated(
    generate: Callable[[list[dict[str, str]]], tuple[str, GenerationResult]],
    *,
    code: int = 6,
    chat: int = 6,
    seed: int = 0,
    edit: bool = True,
) -> list[Asked]:
    """`code` code tasks asked twice (the second edited; word for word
    with edit=False, as a retried or re-run request) and `chat`
    conversations of two turns (the second quoting the first answer),
    through `generate(messages) -> (text, result)`, in that order."""
    from specdec_rs.prompts.training import chat_prompts, code_prompts

    code = _checks.integer(code, "code", minimum=0)
    chat = _checks.integer(chat, "chat", minimum=0)
    edit = _checks.boolean(edit, "edit")
    out: list[Asked] = []
    for prompt in code_prompts(code, seed):
        for repeat, text in ((False, prompt), (True, edited(prompt) if edit else prompt)):
            messages = [{"role": "user", "content": text}]
            out.append(Asked("code", repeat, messages, generate(messages)[1]))
    for prompt in chat_prompts(chat, seed):
        first = [{"role": "user", "content": prompt}]
        answer, result = generate(first)
        out.append(Asked("chat", False, first, result))
        second = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": FOLLOW_UP.format(quote=quote(answer))},
        ]
        out.append(Asked("chat", True, second, generate(second)[1]))
    return out


def totals(asked: list[Asked], where: Callable[[Asked], bool] = lambda a: True) -> dict[str, Any]:
    """Tokens, seconds, tokens/s, tokens per pass and α over the requests chosen."""
    chosen = [a.result for a in asked if where(a)]
    tokens = sum(r.new_tokens for r in chosen)
    seconds = sum(r.time_total for r in chosen)
    tally = sum((r.tally for r in chosen), Tally())
    return {
        "requests": len(chosen),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        "tokens_per_pass": tokens / tally.rounds if tally.rounds else 0.0,
        "alpha": tally.alpha,
    }
