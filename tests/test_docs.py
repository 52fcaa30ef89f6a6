"""The README and the pages of docs/ say what the code does: every printed example is what
its command prints today, every relative link resolves (issue 60: two printed examples had
gone stale unnoticed).

An example is a ``bash`` block holding one ``python -m costmodel`` command followed by a
plain block of what it prints, or a plain block whose first line is ``$ python -m
costmodel ...``. Each printed line must be an output line, in order and with runs of spaces
read as one; a line ending in ``...`` is the start of one; a line that is only ``...``
stands for any number of lines.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from costmodel.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
COMMAND = "python -m costmodel "
PATH = re.compile(r"`((?:costmodel|validate|explorer|tests|benchmarks|scripts|notebooks|docs)"
                  r"/[\w./-]*)`")  # fmt: skip
"""A repository path a page names in backticks."""


def _joined(text: str) -> list[str]:
    """Lines with backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def examples(text: str) -> list[tuple[str, list[str]]]:
    """(command, printed lines) of each example of a page."""
    blocks = [(m[1], m[2]) for m in BLOCK.finditer(text)]
    out = []
    for i, (lang, body) in enumerate(blocks):
        lines = _joined(body)
        if lang == "" and lines and lines[0].startswith("$ " + COMMAND):
            out.append((lines[0][2:], lines[1:]))
        elif lang == "bash" and i + 1 < len(blocks) and blocks[i + 1][0] == "":
            commands = [line for line in lines if line.strip() and not line.startswith("#")]
            if len(commands) == 1 and commands[0].startswith(COMMAND):
                out.append((commands[0], blocks[i + 1][1].splitlines()))
    return out


EXAMPLES = [(page.relative_to(ROOT), cmd, shown) for page in PAGES
            for cmd, shown in examples(page.read_text())]  # fmt: skip


def _norm(line: str) -> str:
    return " ".join(line.split())


def missing(shown: list[str], printed: list[str]) -> str | None:
    """The first shown line the printed output does not have where it should, or None."""
    at, gap = 0, False
    for line in map(_norm, shown):
        if line == "...":
            gap = True
            continue
        want = line[:-3].rstrip() if line.endswith("...") else None

        def ok(have: str, line: str = line, want: str | None = want) -> bool:
            return have.startswith(want) if want is not None else have == line

        rest = printed[at:] if gap else printed[at : at + 1]
        hit = next((j for j, have in enumerate(rest) if ok(_norm(have))), None)
        if hit is None:
            return line
        at, gap = at + hit + 1, False
    return None


def test_the_pages_have_examples():
    assert len(EXAMPLES) >= 5 and any(p.name == "README.md" for p, _, _ in EXAMPLES)


@pytest.mark.parametrize(("page", "command", "shown"), EXAMPLES,
                         ids=[f"{p}:{c[len(COMMAND):][:40]}" for p, c, _ in EXAMPLES])  # fmt: skip
def test_a_printed_example_is_what_the_command_prints(page, command, shown):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(shlex.split(command)[3:])
    assert status == 0 or (status == 1 and " plan " in command), command  # 1: none fits
    lost = missing(shown, out.getvalue().splitlines())
    assert lost is None, f"{page}: `{command}` no longer prints: {lost}\n{out.getvalue()}"


def test_the_comparison_catches_a_stale_number():
    printed = ["verdict fits: peak 31.9 GiB", "step 4.273 s", "limited by compute"]
    assert missing(["verdict fits: peak 31.9 GiB", "...", "limited by compute"], printed) is None
    assert missing(["verdict fits: ...", "step 4.273 s"], printed) is None
    assert missing(["verdict fits: peak 32.0 GiB"], printed) == "verdict fits: peak 32.0 GiB"
    assert missing(["step 4.273 s"], printed) == "step 4.273 s"  # not the first line


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_repository_path_a_page_names_exists(page):
    for path in PATH.findall(page.read_text()):
        assert (ROOT / path.rstrip(".")).exists() or any(ROOT.glob(path.rstrip("."))), path


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: {target}"
