"""The install's warm-up (``costmodel.cli.prewarm``, run by ``scripts/setup.sh``) asks
the README's own first questions, as valid commands, and does nothing without a cache."""

from __future__ import annotations

import re
from pathlib import Path

from costmodel.cli import make_parser, prewarm

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_warm_up_asks_questions_the_readme_asks():
    readme = re.sub(r"\s+", " ", README.replace("`", " ").replace("\\\n", " "))
    for question in prewarm.QUESTIONS:
        assert question in readme, question
        args = make_parser().parse_args(question.split())
        assert args.command == question.split()[0]


def test_setup_runs_the_warm_up():
    setup = (Path(__file__).resolve().parents[1] / "scripts" / "setup.sh").read_text()
    assert "-m costmodel.cli.prewarm" in setup


def test_without_a_cache_there_is_nothing_to_warm(monkeypatch, capsys):
    monkeypatch.setenv("COSTMODEL_CACHE", "off")
    assert prewarm.main() == 0
    assert "nothing to warm" in capsys.readouterr().err
