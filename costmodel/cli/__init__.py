"""Command line: ``python -m costmodel estimate --model cs336-2.7b --batch 4 --seq 1024``.

Every ModelSpec and TrainSpec field is a kebab-case flag generated from the dataclasses, so
any model can be described on the command line; bad values are reported as one line naming
the field and the constraint (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any, NoReturn

GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("costmodel.cli.estimate", "add_estimate_and_presets", ("estimate", "presets", "hardware")),
    ("costmodel.cli.solve", "add_bounds_and_solve", ("bounds", "solve")),
    ("costmodel.cli.plan", "add_plan", ("plan",)),
    ("costmodel.cli.attention", "add_attention", ("attention",)),
    ("costmodel.cli.offload", "add_offload", ("offload",)),
    ("costmodel.cli.offload", "add_padding", ("padding",)),
    ("costmodel.cli.serve", "add_serve", ("serve",)),
    ("costmodel.cli.rl", "add_rl", ("rl",)),
)
"""(module, function, the subcommands it adds), in ``--help``'s order. A command line
imports only its own command's module: ``estimate`` does not load the planner, serving or
RL (0.17 s of a 1.0 s call on 2 cores); a line without a known command builds them all
(its ``--help``, or argparse's list of choices)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag is one line (its own words, naming the flag) and
    exit status 2, not the usage block first; ``--help`` still prints the usage. The
    subcommands' parsers are of this class too (``add_subparsers`` takes the parent's).
    A flag is its whole name: argparse's default takes a prefix (``--micro 2`` was
    ``--microbatch 2``), so a typo or a flag of another command was silently another flag."""

    def __init__(self, *args: Any, allow_abbrev: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def make_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``command``'s group alone (:data:`GROUPS`)
    where it names one."""
    parser = OneLineParser(prog="python -m costmodel", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    groups = [g for g in GROUPS if command in g[2]] or GROUPS
    for module, function, _ in groups:
        getattr(importlib.import_module(module), function)(sub)
    return parser


def _command(argv: list[str] | None) -> str | None:
    """The subcommand a command line names: its first word (options come after it)."""
    words = sys.argv[1:] if argv is None else argv
    return words[0] if words else None


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(_command(argv))
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # said by the subcommand's parser: its name and flags, not the top's
            (_subcommand(parser, args.command) or parser).error(
                f"unrecognized arguments: {' '.join(extra)}")  # fmt: skip
    except SystemExit as done:  # --help (0), or a bad flag already said in one line (2)
        return int(done.code or 0)
    try:
        return args.func(args)
    except BrokenPipeError:  # `| head` closed the pipe; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except (ValueError, KeyError, TypeError) as err:
        message = err.args[0] if err.args else str(err)
        message = as_flags(str(message), _subcommand(parser, args.command))
        print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)
        return 2


_SNAKE = re.compile(r"(?<![\w.`-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w.(`])")
"""A snake_case word standing alone (not a dotted quantity, a call or code in backticks)."""
_WORD = re.compile(
    r"(?<![\w.`-])([a-z][a-z0-9]*)(?=\s*\*|\s+x\s|=|\s+(?:must|needs)\b)"
    r"|(?<=\* )([a-z][a-z0-9]*)\b|(?<=\bx )([a-z][a-z0-9]*)\b|(?<=divide )([a-z][a-z0-9]*)\b"
    r"|(?<=\bor )([a-z][a-z0-9]*)\b(?![.(`])|^([a-z][a-z0-9]*)\b(?![.(`])"
    r"|(?<=\bgive )([a-z][a-z0-9]*)\b(?![.(`])|(?<=\bof )([a-z][a-z0-9]*)(?= \d)"
    r"|(?<=\bneeds )([a-z][a-z0-9]*)\b(?![.(`])"
)
"""A one-word field where a rule names it: a factor of a product, ``got x=``, ``x must``,
the sentence's subject, what to ``give``, a value ``of x 12``."""


def as_flags(message: str, parser: argparse.ArgumentParser | None) -> str:
    """An error sentence in the command line's words: each snake_case field name that is a
    flag of ``parser`` becomes that flag (``n_kv_heads`` -> ``--n-kv-heads``); the specs
    name fields as Python does, which the API and the app keep."""
    if parser is None:
        return message
    flags = {}
    for action in parser._actions:
        long = [o for o in action.option_strings if o.startswith("--") and o[2:5] != "no-"]
        for name in (action.dest, *(o[2:].replace("-", "_") for o in long)) if long else ():
            flags.setdefault(name, long[0])  # the field, and any alias, as the first flag
            if name.endswith("_gb"):  # a byte field the command takes in GB (--device-budget-gb)
                flags.setdefault(name[:-3], long[0])
    message = _SNAKE.sub(lambda m: flags.get(m.group(1), m.group(1)), message)
    return _WORD.sub(lambda m: flags.get(m.group(m.lastindex), m.group(0)), message)


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None
