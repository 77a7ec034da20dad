"""`specdec generate` and `specdec demo`: speculative generation on real models.

specdec generate "PROMPT" [--drafter prompt-lookup|early-exit:L|truncated:L|model:PATH|none]
                 [--k 4] [--temperature 0.7] [--top-k N] [--top-p P] [--min-p P]
                 [--max-new-tokens 128] [--seed S] [--model PATH] [--greedy-draft] [--json]
specdec demo [--max-new-tokens 64] [--temperature 0] [--json]
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

import specdec_rs as sd
from specdec_rs import _checks, models, workloads

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DRAFTER_HELP = (
    "prompt-lookup, early-exit:L (the target's first L layers, sharing its cache), "
    "truncated:L (a separate model made of the target's first L layers), model:PATH "
    "(a local transformers model with the same tokenizer), or none (target only)"
)


def load_target(path: str | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model at `path` (a local transformers folder), else SmolLM2-135M-Instruct."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    if path is None:
        return models.load_smollm2()
    return models.load_local(path)


def check_spec(spec: str) -> str:
    """The kind of a drafter's command-line name, after checking its syntax
    (no model needed); ValueError for anything DRAFTER_HELP does not list."""
    if isinstance(spec, str):
        kind, sep, arg = spec.partition(":")
        if kind in ("none", "prompt-lookup") and not sep:
            return kind
        if kind in ("early-exit", "truncated") and arg.isascii() and arg.isdigit():
            return kind
        if kind == "model" and arg:
            return kind
    raise ValueError(f"--drafter {spec!r} is not understood; expected {DRAFTER_HELP}")


def make_drafter(
    spec: str, target: PreTrainedModel, tokenizer: Any, greedy: bool
) -> sd.Drafter | None:
    """A drafter from its command-line name (see DRAFTER_HELP)."""
    kind = check_spec(spec)
    arg = spec.partition(":")[2]
    if kind == "none":
        return None
    if kind == "prompt-lookup":
        return sd.PromptLookup()
    if kind == "early-exit":
        return sd.EarlyExit(target, int(arg), greedy=greedy)
    if kind == "truncated":
        return sd.DraftModel(models.layer_view(target, int(arg)), greedy=greedy, name=spec)
    draft, draft_tokenizer = models.load_local(arg)
    models.check_same_tokenizer(tokenizer, draft_tokenizer)
    return sd.DraftModel(draft, greedy=greedy, name=spec)


def add_sampling_arguments(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--temperature", type=float, default=temperature)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model", default=None, help="local transformers model folder (default: SmolLM2)"
    )
    p.add_argument(
        "--allow-past-context",
        action="store_true",
        help="run even when prompt + max new tokens passes the model's context",
    )


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    """generate() keywords of the sampling flags."""
    return {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
    }


def add_parsers(sub: Any) -> None:
    g = sub.add_parser("generate", help="speculative generation with statistics")
    g.add_argument("prompt")
    g.add_argument("--drafter", default="prompt-lookup", help=DRAFTER_HELP)
    g.add_argument("--k", type=int, default=4)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--greedy-draft", action="store_true", help="drafts are the drafter's argmax")
    g.add_argument("--raw", action="store_true", help="no chat template around the prompt")
    add_sampling_arguments(g, temperature=0.7)
    g.add_argument("--json", action="store_true")
    d = sub.add_parser("demo", help="built-in prompts through target-only and each drafter")
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument(
        "--prompts", type=int, default=4, help="how many built-in prompts (code and chat)"
    )
    add_sampling_arguments(d, temperature=0.0)
    d.add_argument("--json", action="store_true")


def check_numbers(args: argparse.Namespace) -> None:
    """The numeric flags, checked before the model loads (a fast, clear error)."""
    sd.SamplingConfig(**sampling(args))
    _checks.seed(args.seed, "--seed")
    _checks.integer(args.max_new_tokens, "--max-new-tokens", minimum=1)
    if hasattr(args, "k"):
        _checks.integer(args.k, "--k", minimum=1)


def run_generate(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    check_numbers(args)
    check_spec(args.drafter)
    target, tokenizer = load_target(args.model)
    drafter = make_drafter(args.drafter, target, tokenizer, args.greedy_draft)
    ids = (
        tokenizer(args.prompt, return_tensors="pt")["input_ids"][0]
        if args.raw
        else workloads.encode(tokenizer, args.prompt)
    )
    stream = TextStream(tokenizer, console) if not args.json else None
    result = sd.generate(
        target,
        drafter,
        ids,
        max_new_tokens=args.max_new_tokens,
        k=args.k,
        seed=args.seed,
        **sampling(args),
        vocab_size=len(tokenizer) if drafter is not None else None,
        on_tokens=stream,
        allow_past_context=args.allow_past_context,
    )
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    return {"text": text, **result.summary()}


class TextStream:
    """Prints decoded text as tokens arrive (re-decoding the tail keeps
    multi-token characters intact)."""

    def __init__(self, tokenizer: Any, console: Console):
        self.tokenizer, self.console = tokenizer, console
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, new: list[int]) -> None:
        self.tokens += new
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self.console.out(text[self.printed :], end="", highlight=False)
            self.printed = len(text)


def fmt(x: Any, spec: str) -> str:
    """A number for a table; "-" for an undefined one (None or NaN, e.g. α
    when nothing was drafted)."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def show_generate(r: dict[str, Any], console: Console) -> None:
    console.out("")
    t = Table(title=f"drafter {r['drafter']}, k = {r['k']}, temperature {r['temperature']:g}")
    for col in (
        "new tokens",
        "tokens/s",
        "target passes",
        "tokens/pass",
        "α",
        "draft s",
        "target s",
        "verify s",
    ):
        t.add_column(col, justify="right")
    t.add_row(
        str(r["new_tokens"]),
        fmt(r["tokens_per_second"], ".1f"),
        str(r["rounds"]),
        fmt(r["tokens_per_pass"], ".2f"),
        fmt(r["alpha"], ".3f"),
        fmt(r["time_draft"], ".2f"),
        fmt(r["time_target"], ".2f"),
        fmt(r["time_verify"], ".3f"),
    )
    console.print(t)
    if r["position_alpha"]:
        alphas = ", ".join(fmt(a, ".2f") for a in r["position_alpha"])
        console.print(
            f"acceptance by draft position: [{alphas}]; "
            f"rounds by drafts kept: {r['accepted_histogram']}"
        )
    elif r["drafter"] != "none":
        console.print("no drafts were proposed (α undefined)")


DEMO_DRAFTERS = (("none", 1), ("prompt-lookup", 8), ("early-exit:24", 2), ("truncated:24", 2))


def run_demo(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Each drafter on a few built-in prompts; speedup against target-only
    through the same loop (tokens/s over all prompts together)."""
    code, chat = workloads.prompts("code"), workloads.prompts("chat")
    interleaved = [m for pair in zip(code, chat, strict=False) for m in pair]
    count = _checks.integer(args.prompts, "--prompts", minimum=1, maximum=len(interleaved))
    check_numbers(args)
    target, tokenizer = load_target(args.model)
    messages = interleaved[:count]
    encoded = [workloads.encode(tokenizer, m) for m in messages]
    rows = []
    jobs = [(spec, k, i) for spec, k in DEMO_DRAFTERS for i in range(len(encoded))]
    totals: dict[str, dict[str, Any]] = {}
    for spec, k, i in track(jobs, description="demo", console=console, transient=True):
        drafter = make_drafter(spec, target, tokenizer, greedy=False)
        r = sd.generate(
            target,
            drafter,
            encoded[i],
            max_new_tokens=args.max_new_tokens,
            k=k,
            seed=_checks.seed(args.seed, "--seed") + i,
            **sampling(args),
            allow_past_context=args.allow_past_context,
        )
        t = totals.setdefault(
            spec,
            {
                "drafter": spec,
                "k": k,
                "tokens": 0,
                "seconds": 0.0,
                "passes": 0,
                "kept": 0,
                "checked": 0,
            },
        )
        t["tokens"] += r.new_tokens
        t["seconds"] += r.time_total
        t["passes"] += r.rounds
        t["kept"] += sum(r.accepted)
        t["checked"] += sum(r.reached)
    base = totals["none"]["tokens"] / totals["none"]["seconds"]
    for t in totals.values():
        tps = t["tokens"] / t["seconds"]
        rows.append(
            {
                "drafter": t["drafter"],
                "k": t["k"] if t["drafter"] != "none" else 0,
                "tokens_per_second": tps,
                "tokens_per_pass": t["tokens"] / t["passes"],
                "alpha": t["kept"] / t["checked"] if t["checked"] else None,
                "speedup": tps / base,
            }
        )
    return {
        "temperature": args.temperature,
        "prompts": len(encoded),
        "max_new_tokens": args.max_new_tokens,
        "rows": rows,
    }


def show_demo(r: dict[str, Any], console: Console) -> None:
    t = Table(
        title=f"SmolLM2-135M-Instruct, {r['prompts']} built-in prompts, "
        f"{r['max_new_tokens']} new tokens each, temperature {r['temperature']:g}"
    )
    for col in ("drafter", "k", "tokens/s", "tokens/pass", "α", "speedup"):
        t.add_column(col, justify="right")
    for row in r["rows"]:
        a = fmt(row["alpha"], ".3f")
        t.add_row(
            row["drafter"],
            str(row["k"]),
            f"{row['tokens_per_second']:.1f}",
            f"{row['tokens_per_pass']:.2f}",
            a,
            f"{row['speedup']:.2f}x",
        )
    console.print(t)


def run(args: argparse.Namespace, console: Console) -> tuple[dict[str, Any], Any]:
    if args.command == "generate":
        return run_generate(args, console), show_generate
    return run_demo(args, console), show_demo
