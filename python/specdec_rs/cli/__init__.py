"""The `specdec` command: argument parsing and printing only; every result
comes from a library function (`measure`, `theory`, `generate`).

One parser, a parent for the flags every subcommand shares (--json, --seed)
and one for the model flags (--model, --dtype, --device, --weights, --linear); each subcommand
names its `run` (args, console) -> result and `show` (result, console)
with `set_defaults`. `--json` prints `dataclasses.asdict(result)`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    from specdec_rs.cli import flags, generate, measure, serve, toy, train

    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object")
    common.add_argument("--seed", type=int, default=0)
    model = flags.model_parser(Parser)
    parser = Parser(prog="specdec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    toy.add_parsers(sub, [common])
    generate.add_parsers(sub, [common, model])
    measure.add_parsers(sub, [common, model])
    train.add_parsers(sub, [common, model])
    serve.add_parsers(sub, [common, model])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `specdec` command; its exit status. The subcommands load inside
    the Ctrl-C handler, so an interrupt during the imports (the first few
    tenths of a second) stops as quietly as one during the work."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    from specdec_rs.cli import measure
    from specdec_rs.cli.show import make_console

    args = build_parser().parse_args(argv)
    args.own_process = argv is None  # the `specdec` command itself (`_collector.collector_paused`)
    console = make_console()
    try:
        result = args.run(args, console)
        if args.json:
            print(measure.to_json(result))
        else:
            args.show(result, console)
        return 0 if getattr(result, "passed", True) else 1
    except ValueError as e:
        print(f"specdec: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `specdec ... | head`: the reader left; stop quietly
        sys.stderr.close()
        return 141
    except OSError as e:  # a file could not be written after the checks passed
        print(f"specdec: error: {_one_line(e)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
