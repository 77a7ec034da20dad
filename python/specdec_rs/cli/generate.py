"""specdec generate | demo: speculative generation on real models.

specdec generate "PROMPT" | --prompts-file F
                 [--drafter prompt-lookup|early-exit:L|truncated:L|model:PATH|none]
                 [--k 4 | --tree NODES] [--temperature 0.7] [--top-k N] [--top-p P] [--min-p P]
                 [--max-new-tokens 128] [--greedy-draft] [--draft-confidence TAU] [--raw]
                 [--allow-past-context] [--batch B]
                 [--json-schema FILE | --regex R | --grammar FILE | --choice A,B,C]
                 [--model PATH] [--dtype float32] [--device cpu] [--seed S] [--json]
specdec demo [--prompts 4] [--max-new-tokens 64] [--temperature 0] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specdec_rs import _checks, drafters
from specdec_rs.cli.flags import add_sampling_arguments, check_model_flags, load_target, sampling
from specdec_rs.cli.show import fmt, progress_bars, table
from specdec_rs.engine import Request
from specdec_rs.engine.build import engine_for
from specdec_rs.engine.engine import MAX_ROWS
from specdec_rs.generation import GenerationResult, generate
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.measure.demo import DemoReport, demo, demo_job
from specdec_rs.measure.methods import Method, Policy
from specdec_rs.policy import MAX_K, MAX_TREE, measured_policy
from specdec_rs.prompts import workloads

if TYPE_CHECKING:
    from specdec_rs.structured import Grammar


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("generate", parents=parents, help="speculative generation with statistics")
    g.add_argument("prompt", nargs="?", default=None)
    g.add_argument(
        "--prompts-file",
        default=None,
        metavar="F",
        help="run every prompt of F in one process, in order (prompt i with seed --seed + i): "
        'a .jsonl of {"prompt": ...} or {"messages": [...]} lines or JSON strings, or a '
        "text file of one message per line",
    )
    g.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="B",
        help="with --prompts-file: decode up to B prompts together, new ones joining as others "
        "finish (one target pass per round for all; default γ: the load-aware goodput policy)",
    )
    g.add_argument("--drafter", default="prompt-lookup", help=drafters.spec_help())
    g.add_argument(
        "--k",
        type=int,
        default=None,
        help=f"drafts per round (1..{MAX_K}); default: chosen each round by the measured cost "
        "model (MeasuredK, at most 8; off where speculation does not pay)",
    )
    g.add_argument(
        "--tree",
        type=int,
        default=None,
        help=f"draft trees of at most NODES (1..{MAX_TREE}) nodes per round (prompt-lookup, "
        "suffix, lookahead, eagle, medusa, hybrid)",
    )
    g.add_argument("--max-new-tokens", type=int, default=128, help=f"at most {MAX_NEW_TOKENS:,}")
    g.add_argument("--greedy-draft", action="store_true", help="drafts are the drafter's argmax")
    g.add_argument(
        "--draft-confidence",
        type=float,
        default=0.0,
        metavar="TAU",
        help="eagle, hybrid: draft only while the draft's probability exceeds TAU (0: always)",
    )
    g.add_argument("--raw", action="store_true", help="no chat template around the prompt")
    g.add_argument(
        "--allow-past-context",
        action="store_true",
        help="run even when prompt + max new tokens passes the model's context",
    )
    constrain = g.add_mutually_exclusive_group()
    constrain.add_argument(
        "--json-schema",
        default=None,
        metavar="FILE",
        help="the output is JSON valid under the schema in FILE (compact: no spaces)",
    )
    constrain.add_argument("--regex", default=None, metavar="R", help="the output matches R")
    constrain.add_argument(
        "--grammar",
        default=None,
        metavar="FILE",
        help="the output follows the grammar in FILE (Lark, or llama.cpp's GBNF)",
    )
    constrain.add_argument(
        "--choice", default=None, metavar="A,B,C", help="the output is one of these strings"
    )
    add_sampling_arguments(g, temperature=0.7)
    g.set_defaults(run=run_generate, show=show_generate)
    d = sub.add_parser(
        "demo", parents=parents, help="built-in prompts through target-only and each drafter"
    )
    d.add_argument("--max-new-tokens", type=int, default=64)
    d.add_argument("--prompts", type=int, default=4, help="built-in prompts, chat and code in turn")
    add_sampling_arguments(d, temperature=0.0)
    d.set_defaults(run=run_demo, show=show_demo)


@dataclass(frozen=True)
class GeneratedText:
    """The decoded text and the generation's result; `--json` writes
    `summary()`: the text beside the result's statistics, flat."""

    text: str
    result: GenerationResult

    def summary(self) -> dict[str, Any]:
        return {"text": self.text, **self.result.summary()}


@dataclass(frozen=True)
class GeneratedTexts:
    """`--prompts-file`: each prompt's text and result, and their totals;
    `--json` writes {"results": [each summary], "totals": {...}}."""

    runs: list[GeneratedText]
    batch: BatchSummary | None = None

    def totals(self) -> dict[str, Any]:
        results = [g.result for g in self.runs]
        tokens = sum(r.new_tokens for r in results)
        rounds = sum(r.rounds for r in results)
        # rows of a batch overlap in time: its wall clock, not the sum
        seconds = self.batch.wall_s if self.batch else sum(r.time_total for r in results)
        checked = sum(sum(r.reached) for r in results)
        return {
            "prompts": len(results),
            "new_tokens": tokens,
            "rounds": rounds,
            "tokens_per_pass": tokens / rounds if rounds else 0.0,
            "alpha": sum(sum(r.accepted) for r in results) / checked if checked else float("nan"),
            "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
            "time_total": seconds,
        }

    def summary(self) -> dict[str, Any]:
        out = {"results": [g.summary() for g in self.runs], "totals": self.totals()}
        if self.batch is not None:
            out["batch"] = dataclasses.asdict(self.batch)
        return out


@dataclass(frozen=True)
class BatchSummary:
    """`--batch`: the batch size, its rounds, the wall clock, and the
    goodput (tokens per second over the batch rounds) predicted by the
    policy and measured (None without a policy)."""

    batch: int
    policy: str
    rounds: int
    wall_s: float
    measured_goodput: float
    predicted_goodput: float | None


def check_generate_flags(args: argparse.Namespace) -> list[Any]:
    """Every flag, before the model loads; the prompts (one, or the file's)."""
    check_model_flags(args)
    if (args.prompt is None) == (args.prompts_file is None):
        raise ValueError(
            'give a prompt or --prompts-file F (one of the two): specdec generate "PROMPT" '
            "or specdec generate --prompts-file prompts.jsonl"
        )
    _checks.integer(args.max_new_tokens, "--max-new-tokens", minimum=1, maximum=MAX_NEW_TOKENS)
    if args.k is not None:
        _checks.integer(args.k, "--k", minimum=1, maximum=MAX_K)
    if args.tree is not None:
        _checks.integer(args.tree, "--tree", minimum=1, maximum=MAX_TREE)
    _checks.real(args.draft_confidence, "--draft-confidence", minimum=0.0, below=1.0)
    if args.tree is not None and args.draft_confidence > 0:
        raise ValueError(
            "--draft-confidence gates chains only, and --tree already ranks its candidates by "
            "the head's confidence; drop one of the two"
        )
    drafters.parse_spec(args.drafter)
    if args.batch is not None:
        _checks.integer(args.batch, "--batch", minimum=1, maximum=MAX_ROWS)
        if args.prompts_file is None:
            raise ValueError("--batch decodes the prompts of --prompts-file F together; give F")
        if args.tree is not None:
            raise ValueError("--batch runs chains; drop --tree (or --batch)")
        if args.draft_confidence > 0:
            raise ValueError("--batch runs ungated drafters; drop --draft-confidence")
    if args.prompt is not None:
        return [_checks.utf8_text(args.prompt, "the prompt")]
    from specdec_rs.prompts.training import read_prompts_file

    prompts = read_prompts_file(args.prompts_file)
    if args.raw and any(isinstance(p, list) for p in prompts):
        raise ValueError(
            f"--raw encodes plain text, but {args.prompts_file} holds conversations "
            '({"messages": ...}), which need the chat template; drop --raw'
        )
    _checks.seed(args.seed + len(prompts) - 1, "--seed + the number of prompts - 1")
    return prompts


def grammar_of(args: argparse.Namespace) -> Grammar | None:
    """The grammar the flags ask for (--json-schema, --regex, --grammar,
    --choice), checked before the model loads; None without one."""
    from specdec_rs import _files
    from specdec_rs.structured import Grammar
    from specdec_rs.structured.grammar import MAX_SOURCE

    def text(path: str, flag: str) -> str:
        fix = f"give {flag} a UTF-8 text file"
        return _files.read_text(path, what=f"{flag} file", fix=fix, limit=4 * MAX_SOURCE)

    if args.json_schema is not None:
        return Grammar.json_schema(text(args.json_schema, "--json-schema"))
    if args.regex is not None:
        return Grammar.regex(args.regex)
    if args.grammar is not None:
        return Grammar.grammar(text(args.grammar, "--grammar"))
    if args.choice is not None:
        return Grammar.choice(args.choice.split(","))
    return None


def run_generate(args: argparse.Namespace, console: Console) -> GeneratedText | GeneratedTexts:
    """The text and the generation's statistics; with --prompts-file, each
    prompt's in turn (one drafter object serves them all) and the totals."""
    config = sampling(args)
    prompts = check_generate_flags(args)
    grammar = grammar_of(args)
    target, tokenizer = load_target(args)
    if args.batch is not None:
        return run_batch(args, prompts, target, tokenizer, console, grammar)
    drafter = drafters.from_spec(args.drafter, target, tokenizer, greedy=args.greedy_draft)
    drafter = drafters.gated(drafter, args.draft_confidence)
    many = args.prompts_file is not None
    runs = []
    for i, prompt in enumerate(prompts):
        ids = encode(args, tokenizer, prompt)
        if many and not args.json:
            console.out(f"--- prompt {i + 1} of {len(prompts)}", highlight=False)
        stream = TextStream(tokenizer, console) if not args.json else None
        result: GenerationResult = generate(
            target,
            drafter,
            ids,
            max_new_tokens=args.max_new_tokens,
            k=args.k if args.k is not None else measured_policy(drafter) if drafter else 1,
            seed=args.seed + i,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            min_p=config.min_p,
            vocab_size=len(tokenizer) if drafter is not None else None,
            on_tokens=stream,
            allow_past_context=args.allow_past_context,
            tree=args.tree,
            grammar=grammar,
            tokenizer=tokenizer if grammar is not None else None,
        )
        if stream is not None and many:
            console.out("")
        runs.append(
            GeneratedText(tokenizer.decode(result.tokens, skip_special_tokens=True), result)
        )
    return GeneratedTexts(runs) if many else runs[0]


def encode(args: argparse.Namespace, tokenizer: Any, prompt: Any) -> Any:
    """A prompt's ids: raw text, or the chat template around a message or conversation."""
    if args.raw:
        return tokenizer(prompt, return_tensors="pt")["input_ids"][0]
    return workloads.encode(tokenizer, prompt)


def run_batch(
    args: argparse.Namespace,
    prompts: list[Any],
    target: Any,
    tokenizer: Any,
    console: Console,
    grammar: Grammar | None = None,
) -> GeneratedTexts:
    """--batch B: every prompt through one `BatchEngine` of at most B rows
    (and no more rows than prompts; prompt i with seed --seed + i; γ --k,
    else the goodput policy, started once every prompt passed its checks),
    texts in the file's order."""
    config = sampling(args)
    rows = min(args.batch, len(prompts))
    made = engine_for(
        target,
        tokenizer,
        args.drafter,
        k=args.k,
        greedy_draft=args.greedy_draft,
        start=False,
        max_batch=rows,
        allow_past_context=args.allow_past_context,
    )
    engine, goodput = made.engine, made.policy
    requests = [
        Request(
            encode(args, tokenizer, prompt),
            args.max_new_tokens,
            config.temperature,
            config.top_k,
            config.top_p,
            config.min_p,
            seed=args.seed + i,
            grammar=grammar,
        )
        for i, prompt in enumerate(prompts)
    ]
    for i, request in enumerate(requests):
        engine.check(request, i, where=f"prompt {i + 1}")
    engine.use_goodput(goodput)
    if not args.json:
        console.out(f"--- {len(prompts)} prompts, up to {rows} at a time", highlight=False)
    out = engine.run(requests)
    runs = []
    for i, f in enumerate(out.rows):
        if f.result is None:
            raise ValueError(f"prompt {i + 1}: {f.error}")
        text = tokenizer.decode(f.result.tokens, skip_special_tokens=True)
        if not args.json:
            console.out(f"--- prompt {i + 1} of {len(prompts)}\n{text}", highlight=False)
        runs.append(GeneratedText(text, f.result))
    summary = BatchSummary(
        rows,
        goodput.name if goodput else f"k = {engine.k}",
        len(out.steps),
        out.time_total,
        out.measured_goodput,
        out.predicted_goodput,
    )
    return GeneratedTexts(runs, summary)


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


GENERATE_HEADER = [
    "new tokens",
    "tokens/s",
    "target passes",
    "tokens/pass",
    "α",
    "draft s",
    "target s",
    "verify s",
]


def generate_cells(r: GenerationResult) -> list[str]:
    return [
        str(r.new_tokens),
        fmt(r.tokens_per_second, ".1f"),
        str(r.rounds),
        fmt(r.tokens_per_pass, ".2f"),
        fmt(r.alpha, ".3f"),
        fmt(r.time_draft, ".2f"),
        fmt(r.time_target, ".2f"),
        fmt(r.time_verify, ".3f"),
    ]


def show_generate(g: GeneratedText | GeneratedTexts, console: Console) -> None:
    if isinstance(g, GeneratedTexts):
        show_many(g, console)
        return
    r = g.result
    console.out("")
    shape = f"tree of {r.k}" if r.tree else f"k = {r.k}"
    title = f"drafter {r.drafter}, {shape}, temperature {r.temperature:g}"
    console.print(table(title, GENERATE_HEADER, [generate_cells(r)]))
    if r.reached:
        alphas = ", ".join(fmt(a, ".2f") for a in r.position_alpha)
        console.print(
            f"acceptance by draft position: [{alphas}]; "
            f"rounds by drafts kept: {r.accepted_histogram}"
        )
    elif r.drafter != "none":
        console.print("no drafts were proposed (α undefined)")
    if r.grammar_accepting is not None:
        state = (
            "the output is a complete match"
            if r.grammar_accepting
            else "the budget ended before the grammar accepted: the output is incomplete"
        )
        console.print(f"grammar: {state}; {r.forced_accepted} of {r.forced} forced drafts kept")


def show_many(g: GeneratedTexts, console: Console) -> None:
    first = g.runs[0].result
    t = g.totals()
    rows = [[str(i + 1), *generate_cells(run.result)] for i, run in enumerate(g.runs)]
    rows.append(
        [
            "all",
            str(t["new_tokens"]),
            fmt(t["tokens_per_second"], ".1f"),
            str(t["rounds"]),
            fmt(t["tokens_per_pass"], ".2f"),
            fmt(t["alpha"], ".3f"),
            "",
            "",
            "",
        ]
    )
    title = f"{t['prompts']} prompts, drafter {first.drafter}, temperature {first.temperature:g}"
    console.print(table(title, ["prompt", *GENERATE_HEADER], rows))
    b = g.batch
    if b is not None:
        predicted = "" if b.predicted_goodput is None else f", predicted {b.predicted_goodput:.1f}"
        console.print(
            f"batch {b.batch} ({b.policy}): {b.rounds} rounds in {b.wall_s:.2f} s; goodput over "
            f"the rounds {b.measured_goodput:.1f} tokens/s measured{predicted}"
        )


def run_demo(args: argparse.Namespace, console: Console) -> DemoReport:
    config = sampling(args)
    check_model_flags(args)
    _checks.integer(args.max_new_tokens, "--max-new-tokens", minimum=1, maximum=MAX_NEW_TOKENS)
    _checks.integer(args.prompts, "--prompts", minimum=1, maximum=2 * len(workloads.CHAT_PROMPTS))
    target, tokenizer = load_target(args)
    job = demo_job(
        target,
        tokenizer,
        prompts=args.prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=config.temperature,
        seed=args.seed,
    )
    with progress_bars(console) as progress:
        return demo(job, prompts=args.prompts, progress=progress)


def demo_k(method: Method) -> str:
    """The γ cell of a demo row: k, "<= k" (measured, at most k), or 0."""
    if method.policy == Policy.FIXED:
        return str(method.k or 0)
    return f"<= {method.k}" if method.policy == Policy.MEASURED else "0"


def show_demo(r: DemoReport, console: Console) -> None:
    rows = [
        [
            row.totals.drafter,
            demo_k(row.totals.method),
            f"{row.totals.tokens_per_second:.1f}",
            fmt(row.totals.tokens_per_pass, ".2f"),
            fmt(row.totals.alpha, ".3f"),
            f"{row.speedup:.2f}x",
        ]
        for row in r.rows
    ]
    title = (
        f"{r.prompts} built-in prompts, {r.max_new_tokens} new tokens each, "
        f"temperature {r.temperature:g}"
    )
    console.print(table(title, ["drafter", "k", "tokens/s", "tokens/pass", "α", "speedup"], rows))
    for note in r.skipped:
        console.print(f"left out: {note}")
