"""Shared fixtures; ``gpu`` tests skip cleanly without CUDA; under pytest-xdist the tests
of the modules that launch torch.distributed ranks run on one worker, one at a time, while
the other worker runs the rest (two launches never share the cores, and a module's cached
launch serves all its tests)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import validate.reference.attention  # noqa: F401  (sets TRITON_INTERPRET before triton loads)

# pytest-xdist's workers already fill the cores: a large sweep runs in one thread
os.environ.setdefault("COSTMODEL_WORKERS", "1")

RANK_MODULES = frozenset(
    path.name
    for path in Path(__file__).parent.glob("test_*.py")
    if re.search(
        r"^(from validate\.distributed\.launch import .*\blaunch\b|LAUNCHES_RANKS = True)",
        path.read_text(),
        re.M,
    )
)
"""Test modules that launch ranks (``validate.distributed.launch.launch``, or torchrun: such
a module says ``LAUNCHES_RANKS = True``)."""


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's load-by-scope scheduler with one scope for every test of
    :data:`RANK_MODULES` (the largest scope, so it starts first) and one per test else."""
    from xdist.scheduler import LoadScopeScheduling

    class RanksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return "ranks" if module in RANK_MODULES else nodeid

    return RanksTogether(config, log)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def refused(capsys):
    """``refused(argv)``: the CLI refuses ``argv`` (exit 2) with one line on stderr, which it
    returns."""
    from costmodel.cli import main

    def run(argv: list[str]) -> str:
        try:
            rc = main(argv)
        except SystemExit as exit_:
            rc = exit_.code
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1, (rc, err)
        return err

    return run
