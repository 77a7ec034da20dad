"""Built-in prompt workloads: code editing and open chat.

Code editing asks the model to rewrite a real function, taken at run time from
the Python standard library with ``inspect.getsource`` (so the exact text
follows the running Python's version). Its answer mostly copies the function,
which is where prompt lookup shines. Chat prompts are open-ended questions.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

# module.qualname of pure-Python standard-library functions (PSF license)
CODE_FUNCTIONS = (
    "textwrap.dedent",
    "textwrap.indent",
    "textwrap.shorten",
    "shlex.quote",
    "fnmatch.filter",
    "fnmatch.fnmatch",
    "string.capwords",
    "html.escape",
    "base64.b64encode",
    "base64.b64decode",
    "calendar.leapdays",
    "colorsys.rgb_to_hsv",
    "colorsys.rgb_to_hls",
    "statistics.median",
    "statistics.mode",
    "glob.escape",
    "urllib.parse.quote_plus",
    "heapq.nsmallest",
    "difflib.get_close_matches",
    "copy.copy",
)

CODE_TASKS = (
    "Add type hints to this function. Reply with the complete function only.",
    "Add a comment above each block of this function explaining what it does. "
    "Reply with the complete function only.",
)

CHAT_PROMPTS = (
    "What are three good habits for staying focused while studying?",
    "Explain why the sky is blue to a ten-year-old.",
    "Write a short story about a robot who learns to paint.",
    "What is the difference between weather and climate?",
    "Give me some tips for a first job interview.",
    "How do vaccines train the immune system?",
    "Describe a relaxing weekend in the mountains.",
    "What are the pros and cons of working from home?",
    "Explain what a black hole is in simple terms.",
    "Suggest a healthy breakfast and explain why it is healthy.",
    "Why do leaves change colour in autumn?",
    "Write a friendly email inviting a colleague to lunch.",
    "How does a bicycle stay upright when it moves?",
    "What should I pack for a week-long beach holiday?",
    "Explain the water cycle step by step.",
    "What makes a good friend?",
    "Give me a simple recipe for tomato soup.",
    "Why is sleep important for memory?",
    "Describe the life cycle of a butterfly.",
    "What are some ways to save energy at home?",
)

WORKLOADS = ("code", "chat")


def function_source(name: str) -> str:
    """Source text of a dotted standard-library function name."""
    module_name, _, attr = name.rpartition(".")
    obj = getattr(importlib.import_module(module_name), attr)
    return inspect.getsource(obj)


def code_prompts() -> list[str]:
    """20 user messages: a rewrite task followed by the function's source."""
    return [
        f"{CODE_TASKS[i % len(CODE_TASKS)]}\n\n```python\n{function_source(name)}```"
        for i, name in enumerate(CODE_FUNCTIONS)
    ]


def prompts(workload: str) -> list[str]:
    """The user messages of `workload` ('code' or 'chat')."""
    if _checks.choice(workload, "workload", WORKLOADS) == "code":
        return code_prompts()
    return list(CHAT_PROMPTS)


def encode(tokenizer: PreTrainedTokenizerBase, message: str | list[dict[str, str]]) -> torch.Tensor:
    """(n,) prompt ids: the user's message (or a conversation: a list of
    {"role", "content"} turns) in the tokenizer's chat template, ready for the
    assistant's reply (a message without a template: plain encoding)."""
    import torch

    conversation = isinstance(message, list)
    if not conversation and not isinstance(message, str):
        raise ValueError(
            f"message is a {type(message).__name__}; expected the user's text or a list of turns"
        )
    if not callable(tokenizer):
        raise ValueError(f"tokenizer is a {type(tokenizer).__name__}; expected a tokenizer")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if conversation and not has_template:
        raise ValueError("a conversation needs a tokenizer with a chat template; this one has none")
    if has_template:
        out = tokenizer.apply_chat_template(
            message if conversation else [{"role": "user", "content": message}],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )
        return torch.as_tensor(out["input_ids"][0])
    return torch.as_tensor(tokenizer(message, return_tensors="pt")["input_ids"][0])


def prompt_set(tokenizer: PreTrainedTokenizerBase, workload: str, count: int) -> list[torch.Tensor]:
    """The first `count` prompts of `workload`, encoded; 1 <= count <= the
    workload's size (a ValueError otherwise, never a silent shorter list)."""
    messages = prompts(workload)
    count = _checks.integer(count, "prompts", minimum=1, maximum=len(messages))
    return [encode(tokenizer, m) for m in messages[:count]]


def check_names(names: Any) -> list[str]:
    """A non-empty list of workload names."""
    if isinstance(names, str):
        names = [names]
    checked = [_checks.choice(n, "workloads", WORKLOADS) for n in names]
    if not checked:
        raise ValueError(f"workloads: name at least one of {WORKLOADS}")
    return checked
