"""Issue 35: every plan row prints the ``estimate`` command that reproduces it, and for
over 1,000 rows drawn at random from two plans (dense and MoE with expert parallelism;
FSDP2 and Megatron, with and without pipelines and recomputation) that command, read by
the CLI's own parser and built by the CLI's own ``inputs.build``, gives the row's step
time, peak memory and MFU (to float64 rounding: the plan evaluates in numpy floats,
estimate exactly)."""

from __future__ import annotations

import argparse
import shlex
from collections import Counter

import numpy as np
import pytest

from costmodel import TrainSpec, get_hardware, get_model
from costmodel.cli import make_parser
from costmodel.cli.args import values_of
from costmodel.cli.plan import estimate_command
from costmodel.engine.fit import DEFAULT_HEADROOM
from costmodel.engine.plan import PlanOptions, plan
from costmodel.engine.quantities import structure_of
from costmodel.inputs import build

CHECKED = ("time_s.step", "memory_bytes_per_device.peak", "mfu", "tokens_per_s")
QUESTIONS = [  # (model, given inputs, gpus, global batch, search, structures, rows)
    ("llama3-8b", {"seq": 4096}, 16, 64,
     PlanOptions(frameworks=("fsdp2", "megatron"), recompute=("none", "full"), interleave=(1,)),
     8, 700),
    ("mixtral-8x7b", {"seq": 2048}, 32, 64,
     PlanOptions(frameworks=("megatron", "fsdp2"), recompute=("full",), interleave=(1,)), 4, 300),
]  # fmt: skip
"""Each question's rows are drawn from its most populous structures (each structure is
compiled once by the plan and once by estimate: a bounded cost on a 2-core machine)."""


def _rows():
    rng = np.random.default_rng(35)
    for name, given, gpus, batch, options, structures, n in QUESTIONS:
        model, train = get_model(name), TrainSpec(batch=batch, **given)
        result = plan(model, train, get_hardware("h100-sxm"), gpus, options)
        keys = [structure_of(model, result.train_spec(i), result.parallel_spec(i))
                for i in range(result.valid)]  # fmt: skip
        common = {k for k, _ in Counter(keys).most_common(structures)}
        pool = [i for i, k in enumerate(keys) if k in common]
        args = argparse.Namespace(hardware="h100-sxm", gpus=gpus, global_batch=batch,
                                  memory_headroom=DEFAULT_HEADROOM)  # fmt: skip
        for i in rng.choice(pool, min(n, len(pool)), replace=False):
            row = result.row(int(i))
            yield row, estimate_command(row, {"model": name, **given}, args)


@pytest.fixture(scope="module")
def rows():
    return list(_rows())


def test_over_a_thousand_plan_rows_reproduce_in_estimate(rows):
    assert len(rows) >= 1000
    kinds = {(r["framework"], r["pp"] > 1, r["recompute"], r["ep"] > 1) for r, _ in rows}
    assert len(kinds) >= 6  # frameworks, pipelines, recompute policies, expert parallelism
    parser = make_parser()
    for row, command in rows:
        argv = shlex.split(command)
        assert argv[:4] == ["python", "-m", "costmodel", "estimate"]
        est = build(values_of(parser.parse_args(argv[3:]))).estimate()
        for key in CHECKED:
            assert est[key] == pytest.approx(row[key], rel=1e-9), (command, key)


def test_the_command_states_every_layout_flag(rows):
    """No default is taken for what the row chose: a later change of a default (the
    micro-batch, the sharding) cannot make the command disagree with the row."""
    _, command = rows[0]
    for flag in ("--framework", "--dp", "--fsdp", "--tp", "--pp", "--cp", "--ep", "--microbatch",
                 "--recompute", "--gpus", "--batch", "--hardware"):  # fmt: skip
        assert f" {flag} " in command, flag


def test_the_cli_and_the_app_name_a_changed_field_alike():
    """Issue 60: the CLI's "how the next differ" said ``sequence_parallel True->False`` where
    the app's column says it in words; both read ``engine.why.change_words``."""
    from costmodel.engine.why import change_words

    changed = {"sequence_parallel": [True, False], "micro_batch": [1, 2], "dp": [1, 2]}
    assert change_words(changed) == "sequence parallel on->off, micro-batch 1->2, dp 1->2"
    assert change_words(changed, "→").startswith("sequence parallel on→off")
    # a probe: Megatron's row beside FSDP2's said "zero 1→3", the field's name; the sidebar
    # calls it "ZeRO stage"
    moved = {"framework": ["megatron", "fsdp2"], "zero": [1, 3]}
    assert change_words(moved, "→") == "framework megatron→fsdp2, ZeRO stage 1→3"
