"""The built-in training prompts: open-ended chat over many topics and kinds
of instruction, and code tasks on functions taken from the installed Python's
standard library. Disjoint from the evaluation prompts in
`specdec_rs.prompts.workloads` (checked by `check_held_out`), which stay held
out. Deterministic for a seed.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import os
import random
from pathlib import Path
from typing import Any

from specdec_rs import _checks
from specdec_rs.prompts import workloads

TOPICS = (
    "photosynthesis",
    "the French Revolution",
    "compound interest",
    "volcanoes",
    "the Roman Empire",
    "machine learning",
    "coffee brewing",
    "the human heart",
    "electric cars",
    "honeybees",
    "the stock market",
    "jazz music",
    "plate tectonics",
    "the printing press",
    "recycling",
    "the moon landing",
    "chess openings",
    "rainforests",
    "the immune system",
    "solar panels",
    "ancient Egypt",
    "the internet",
    "meditation",
    "earthquakes",
    "the Renaissance",
    "credit scores",
    "dinosaurs",
    "the periodic table",
    "marathon training",
    "bread baking",
    "the Silk Road",
    "quantum computers",
    "time management",
    "coral reefs",
    "democracy",
    "the Industrial Revolution",
    "public speaking",
    "gardening",
    "the water table",
    "origami",
    "wind turbines",
    "the Olympic Games",
    "inflation",
    "sharks",
    "the Great Wall of China",
    "nutrition labels",
    "climate change",
    "the violin",
    "smartphones",
    "photography",
    "the Amazon river",
    "first aid",
    "cryptography",
    "the Moon's phases",
    "tea ceremonies",
    "bird migration",
    "supply and demand",
    "the Eiffel Tower",
    "vaccination history",
    "minimalism",
    "the theory of evolution",
    "glaciers",
    "budgeting",
    "robots",
    "Shakespeare's plays",
    "the Milky Way",
    "sourdough starters",
    "volunteering",
    "the Pythagorean theorem",
    "mushrooms",
    "trains",
    "the Arctic",
    "negotiation",
    "3D printing",
    "the Byzantine Empire",
    "spreadsheets",
    "yoga",
    "hurricanes",
    "the Mona Lisa",
    "password security",
    "electric guitars",
    "the nervous system",
    "desert animals",
    "board games",
    "renewable energy",
    "the Cold War",
    "learning a new language",
    "bridges",
    "soap",
    "the speed of light",
)

KINDS = (
    "Explain {t} to a complete beginner.",
    "Write a short poem about {t}.",
    "Give me five interesting facts about {t}.",
    "What are common misconceptions about {t}?",
    "Write a short story in which {t} plays an important role.",
    "Summarize the history of {t} in a few paragraphs.",
    "List the advantages and disadvantages of {t}.",
    "How would you teach a child about {t}?",
    "Write a blog post introduction about {t}.",
    "What questions would an expert ask about {t}?",
    "Describe {t} using an everyday analogy.",
    "Write a quiz with three questions about {t}, with answers.",
    "What is the future of {t}?",
    "Write a dialogue between two friends discussing {t}.",
    "Give step-by-step advice for someone getting started with {t}.",
    "Compare {t} with {u}.",
    "Write a product description for a book about {t}.",
    "Why does {t} matter today?",
)

# pure-Python standard-library modules whose functions become code tasks
CODE_MODULES = (
    "json.encoder",
    "json.decoder",
    "posixpath",
    "ntpath",
    "collections",
    "email.utils",
    "urllib.parse",
    "string",
    "textwrap",
    "random",
    "csv",
    "ipaddress",
    "fractions",
    "decimal",
    "datetime",
    "pathlib",
    "shutil",
    "tempfile",
    "zipfile",
    "tarfile",
    "gzip",
    "argparse",
    "logging",
    "configparser",
    "pprint",
    "inspect",
    "dataclasses",
    "enum",
    "functools",
    "operator",
    "bisect",
    "heapq",
    "statistics",
    "calendar",
    "difflib",
    "filecmp",
    "getopt",
    "gettext",
    "locale",
    "mimetypes",
    "netrc",
    "optparse",
    "plistlib",
    "quopri",
    "sched",
    "shlex",
    "smtplib",
    "tokenize",
    "traceback",
    "uuid",
    "webbrowser",
    "wave",
    "xml.dom.minidom",
    "http.cookies",
    "http.client",
    "ftplib",
    "imaplib",
    "poplib",
    "html.parser",
)

CODE_TASKS = (
    "Explain what this function does, step by step.",
    "Write a docstring for this function. Reply with the complete function only.",
    "Add type hints to this function. Reply with the complete function only.",
    "Rewrite this function with clearer variable names. Reply with the complete function only.",
    "Write two unit tests for this function using pytest.",
    "Point out possible bugs or edge cases in this function.",
    "Add a comment above each block of this function explaining what it does. "
    "Reply with the complete function only.",
    "Translate this function to JavaScript.",
)


def chat_prompts(count: int, seed: int) -> list[str]:
    """`count` distinct (topic, kind) prompts, drawn without replacement."""
    rng = random.Random(seed)
    pairs = [(t, k) for t in TOPICS for k in KINDS]
    rng.shuffle(pairs)
    out = []
    for topic, kind in pairs[:count]:
        other = rng.choice([u for u in TOPICS if u != topic])
        out.append(kind.format(t=topic, u=other))
    return out


def library_functions(max_lines: int = 40) -> list[str]:
    """Sources of the module-level functions of CODE_MODULES (3 to
    `max_lines` lines), minus the evaluation workload's functions."""
    held_out = set(workloads.CODE_FUNCTIONS)
    sources = []
    for module_name in CODE_MODULES:
        try:
            module = importlib.import_module(module_name)
            tree = ast.parse(inspect.getsource(module))
        except (ImportError, OSError, TypeError, SyntaxError):
            continue
        text = inspect.getsource(module).splitlines(keepends=True)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or f"{module_name}.{node.name}" in held_out:
                continue
            lines = text[node.lineno - 1 : node.end_lineno]
            if 3 <= len(lines) <= max_lines:
                sources.append("".join(lines))
    return sources


def code_prompts(count: int, seed: int) -> list[str]:
    """`count` code tasks: a task followed by a library function's source."""
    rng = random.Random(seed + 1)
    functions = library_functions()
    rng.shuffle(functions)
    return [
        f"{CODE_TASKS[i % len(CODE_TASKS)]}\n\n```python\n{source}```"
        for i, source in enumerate(functions[:count])
    ]


def training_prompts(count: int = 1200, *, code_fraction: float = 0.3, seed: int = 0) -> list[str]:
    """`count` training prompts, `code_fraction` of them code tasks, shuffled
    with `seed`; never one of the evaluation prompts."""
    count = _checks.integer(count, "count", minimum=1, maximum=len(TOPICS) * len(KINDS))
    code = min(
        round(count * _checks.real(code_fraction, "code_fraction", minimum=0.0, maximum=1.0)),
        len(library_functions()),
    )
    out = chat_prompts(count - code, seed) + code_prompts(code, seed)
    random.Random(seed + 2).shuffle(out)
    check_held_out(out)
    return out


def check_held_out(prompts: list[str]) -> None:
    """ValueError if a training prompt is one of the evaluation prompts."""
    evaluation = set(workloads.prompts("chat")) | set(workloads.prompts("code"))
    shared = [p for p in prompts if p in evaluation]
    if shared:
        raise ValueError(
            f"{len(shared)} training prompts are evaluation prompts, e.g. {shared[0][:60]!r}"
        )


EXPECTED_LINE = '{"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}, ...]}'
ROLES = ("system", "user", "assistant")

# a user message, or a conversation (a list of {"role", "content"} turns ending with the user's)
Prompt = str | list[dict[str, str]]


MAX_PROMPTS_FILE = 1 << 30  # bytes


def read_prompts_file(path: Any) -> list[Prompt]:
    """Your own training prompts: a `.jsonl` file (any case) with one JSON
    object per line, {"prompt": "..."} (a user message, which may hold
    newlines) or {"messages": [{"role": ..., "content": ...}, ...]} (a
    conversation, e.g. from a chat log; trailing assistant turns are
    dropped, since the target writes its own answer to the last user turn),
    or one JSON string; any other file: one user message per non-empty line.
    Lines end at "\n" only (a "\r" before it is dropped), so U+2028, U+0085
    or a form feed inside a string stays in it; a UTF-8 byte-order mark is
    dropped. ValueError naming the file and line for a missing or empty
    file, text that is not UTF-8, a string that cannot be encoded as UTF-8
    (a lone surrogate such as "\ud800"), or a bad line."""
    from specdec_rs import _files

    p = Path(os.fspath(path)).expanduser()
    if not p.is_file():
        raise ValueError(f"prompts_file = {str(p)!r} is not a file; give a .jsonl or text file")
    text = _files.read_text(
        p, what="prompts file", fix="give a UTF-8 .jsonl or text file", limit=MAX_PROMPTS_FILE
    )
    jsonl = p.suffix.lower() == ".jsonl"
    out: list[Prompt] = []
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if not jsonl:
            out.append(_checks.utf8_text(line.strip(), f"{p}:{n}"))
            continue
        item = _files.parse_json(
            line, where=f"{p}:{n}", what="line", fix=f"expected {EXPECTED_LINE}"
        )
        out.append(_prompt_of(item, f"{p}:{n}"))
    if not out:
        raise ValueError(f"prompts_file = {str(p)!r} holds no prompts")
    return out


def _prompt_of(item: Any, where: str) -> Prompt:
    """The prompt of one JSON line (see `read_prompts_file`)."""
    if isinstance(item, dict) and "messages" in item:
        turns = item["messages"]
        ok = isinstance(turns, list) and all(
            isinstance(t, dict) and t.get("role") in ROLES and isinstance(t.get("content"), str)
            for t in turns
        )
        if not ok:
            raise ValueError(
                f'{where}: messages must be a list of {{"role": one of {ROLES}, '
                '"content": "..."} turns'
            )
        while turns and turns[-1]["role"] == "assistant":
            turns = turns[:-1]
        if not turns or turns[-1]["role"] != "user" or not turns[-1]["content"].strip():
            raise ValueError(f"{where}: the conversation has no user turn for the target to answer")
        return [
            {"role": t["role"], "content": _checks.utf8_text(t["content"], where)} for t in turns
        ]
    prompt = item.get("prompt") if isinstance(item, dict) else item
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: expected {EXPECTED_LINE} with a non-empty string")
    return _checks.utf8_text(prompt, where)


def prompts_digest(path: Any) -> str:
    """sha256 of a prompts file's bytes (the data's manifest records it, so a
    changed file is not mixed with shards made from the old one)."""
    return hashlib.sha256(Path(os.fspath(path)).expanduser().read_bytes()).hexdigest()
