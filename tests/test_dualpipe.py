"""DualPipe (``ParallelSpec.pp_schedule``; DeepSeek-V3 report Sec. 3.2.1, Table 2;
deepseek-ai/DualPipe): each rank holds a stage of each direction (twice a stage's
parameters, both ends on the end ranks), keeps pp + 1 micro-batches in flight, idles
(pp/2 - 1)(F&B + B - 3W) per step and hides the all-to-alls of every forward-backward pair;
what DualPipe's ``step`` refuses is refused, naming the field."""

from __future__ import annotations

import types

import pytest
import sympy as sp

from costmodel import ParallelSpec, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.engine.verdict import assumptions
from costmodel.parallel.pipeline import (
    PipelineRank,
    chunks_in_flight,
    combined_alone,
    held_layers,
    rank_layers,
    ranks,
)
from costmodel.parallel.state import params_per_device
from costmodel.specs.checks import SpecError
from costmodel.symbols import L, N_pp, v
from costmodel.symbols import m as m_symbol

H100 = get_hardware("h100-sxm")
LLAMA = get_model("llama3-8b")
MIXTRAL = get_model("mixtral-8x7b")
TRAIN = TrainSpec(batch=64, seq=4096, grad_accum=16)
PIPE = {"dp": 4, "pp": 4, "framework": "megatron"}


def _estimate(model, layout: dict, train: TrainSpec = TRAIN, **changes):
    return estimate(model, train, ParallelSpec(**layout, **changes), H100)


def _value(est, key: str) -> float:
    return float(est[key])


def _weights(est, layers: int) -> float:
    """W: a micro-batch's weight gradients on a stage of ``layers`` blocks, each matmul's
    dW priced as its forward (the roofline's per-layer seconds, and the head's once)."""
    skip = (".attn_core.", ".lm_head.")
    ops = [k.split(".")[1] for k in est.values if k.startswith("roofline.")
           and k.endswith(".time_s") and not any(s in k for s in skip)]  # fmt: skip
    gemms = layers * sum(_value(est, f"roofline.{op}.time_s") for op in ops)
    return gemms + _value(est, "roofline.lm_head.time_s")


def test_the_bubble_is_deepseeks_formula():
    """(pp/2 - 1)(F&B + B - 3W) of one micro-batch's forward F and backward B on a stage (F&B
    their sum: the pair's compute) and W its weight gradients, each matmul's dW priced as
    its forward; 1F1B's (pp - 1)(F + B) beside it."""
    dual = _estimate(LLAMA, PIPE, pp_schedule="dualpipe")
    f, b = (_value(dual, f"time_s.microbatch_{p}") for p in ("forward", "backward"))
    w = _weights(dual, layers=8)
    assert _value(dual, "time_s.bubble") == pytest.approx((4 / 2 - 1) * (f + 2 * b - 3 * w))
    plain = _estimate(LLAMA, PIPE)
    f1, b1 = (_value(plain, f"time_s.microbatch_{p}") for p in ("forward", "backward"))
    assert _value(plain, "time_s.bubble") == pytest.approx(3 * (f1 + b1))
    assert _value(dual, "time_s.bubble") < _value(plain, "time_s.bubble") / 2


def test_two_stages_have_no_bubble():
    dual = _estimate(LLAMA, {**PIPE, "dp": 2, "pp": 2}, pp_schedule="dualpipe")
    assert _value(dual, "time_s.bubble") == 0


def test_an_end_rank_holds_two_stages_and_both_ends():
    """Rank 0 holds stage 0 (the embedding) and stage pp - 1 (the head and final norm):
    exactly 1F1B's first and last ranks together; a middle rank two middle stages."""
    one, dual = ParallelSpec(**PIPE), ParallelSpec(**PIPE, pp_schedule="dualpipe")
    est = _estimate(LLAMA, PIPE)

    def count(par, rank: PipelineRank | None) -> float:
        return float(est.evaluate(params_per_device(LLAMA, par, rank)[0]))

    first, second, last = ranks(one)
    end, middle = ranks(dual)
    assert end.first and end.last
    assert count(dual, end) == pytest.approx(count(one, first) + count(one, last))
    assert count(dual, middle) == pytest.approx(2 * count(one, second))
    busiest = count(dual, None)  # what the optimizer and the gradient reduce price:
    # two of the busiest stages and both ends, the norms spread evenly over the stages
    assert busiest == pytest.approx(count(dual, end), rel=1e-6)


@pytest.mark.parametrize(
    ("layers", "index", "expected"), [(32, 0, 16), (30, 0, 15), (34, 0, 17), (34, 1, 17)]
)
def test_rank_layers_are_stage_r_and_stage_pp_minus_1_minus_r(layers, index, expected):
    """The earlier stages take the spare layers (1F1B's split): 30 over 4 is 8, 8, 7, 7, so
    rank 0 holds 8 + 7; 34 is 9, 9, 8, 8: 9 + 8 on rank 0 and on rank 1."""
    dual = ParallelSpec(pp=4, pp_schedule="dualpipe")
    rank = PipelineRank(index, False, False)
    assert rank_layers(dual, rank).subs({L: layers, N_pp: 4, v: 1}) == expected


def test_pp_plus_one_micro_batches_of_one_stage_are_in_flight():
    """DeepSeek's Table 2: PP + 1 against 1F1B's PP, in one stage's activations."""
    dual = ParallelSpec(pp=4, pp_schedule="dualpipe")
    rank = PipelineRank(0, True, True)
    assert held_layers(dual, rank).subs({L: 32, N_pp: 4, m_symbol: 16, v: 1}) == 5 * 8
    plain = PipelineRank(0, True, False)
    assert (
        held_layers(ParallelSpec(pp=4), plain).subs({L: 32, N_pp: 4, m_symbol: 16, v: 1}) == 4 * 8
    )


def test_only_the_forwards_that_run_alone_wait_for_their_all_to_alls():
    """The first rank pairs m - 3pp/2 + 1 of its m forwards with a backward (DualPipe's main
    and fifth steps), so 3pp/2 - 1 wait for their dispatch and combine; 1F1B's all."""
    layout = {"dp": 4, "pp": 4, "ep": 4, "framework": "megatron"}
    dual = _estimate(MIXTRAL, layout, pp_schedule="dualpipe")
    assert _value(dual, "comm_exposed_share.ep") == pytest.approx((1.5 * 4 - 1) / 16)
    assert _value(_estimate(MIXTRAL, layout), "comm_exposed_share.ep") == 1
    assert _value(dual, "comm_time_s.ep") == pytest.approx(
        _value(_estimate(MIXTRAL, layout), "comm_time_s.ep"))  # fmt: skip
    assert "all-to-alls overlapped (DualPipe's forward-backward pairs)" in assumptions(dual)


@pytest.mark.parametrize(
    ("layout", "train", "field"),
    [
        ({**PIPE, "dp": 2, "pp": 3}, TrainSpec(batch=96, seq=4096, grad_accum=16), "pp"),
        ({**PIPE, "pp_interleave": 2}, TRAIN, "pp_interleave"),
        (PIPE, TrainSpec(batch=60, seq=4096, grad_accum=15), "grad_accum"),
        (PIPE, TrainSpec(batch=24, seq=4096, grad_accum=6), "grad_accum"),
    ],
)
def test_what_dualpipe_refuses_is_refused_by_name(layout, train, field):
    """An odd pp, interleaving, and micro-batches odd or fewer than 2 pp (DualPipe's
    ``assert num_ranks % 2 == 0`` and ``num_chunks % 2 == 0 and num_chunks >= num_ranks *
    2``)."""
    with pytest.raises(SpecError, match="dualpipe") as err:
        _estimate(LLAMA, layout, train, pp_schedule="dualpipe")
    assert err.value.field in (field, "pp_schedule")


def _torch_dualpipev(pp: int, m: int, rank: int) -> tuple[int, int]:
    """(most virtual-stage micro-batches in flight, forwards run alone) on ``rank`` of
    torch's ``ScheduleDualPipeV`` order for pp ranks and m micro-batches: the schedule's
    own action list (built without a process group: it reads only these three numbers)."""
    from torch.distributed.pipelining import schedules

    fields = {"pp_group_size": pp, "_n_microbatches": m, "_num_stages": 2 * pp}
    actions = schedules.ScheduleDualPipeV._calculate_single_rank_operations(
        types.SimpleNamespace(**fields), rank
    )
    backward = (schedules.BACKWARD_INPUT, schedules.FULL_BACKWARD)
    held = most = alone = 0
    for action in filter(None, actions):
        if action.sub_actions:  # a forward run beside a backward: one in, one out
            most = max(most, held + 1)
        elif action.computation_type == schedules.FORWARD:
            held, alone = held + 1, alone + 1
            most = max(most, held)
        elif action.computation_type in backward:
            held -= 1
    return most, alone


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (3, 12), (4, 8), (4, 16), (8, 32)])
def test_dualpipev_keeps_and_exposes_what_torchs_schedule_does(pp, m):
    """2pp + 1 virtual-stage micro-batches in flight on every rank, and 3pp - 1 of the first
    rank's 2m forwards alone (its all-to-alls exposed), as torch's order has them."""
    pytest.importorskip("torch.distributed.pipelining.schedules")
    vee = ParallelSpec(pp=pp, pp_interleave=2, pp_schedule="dualpipev")
    values = {N_pp: pp, m_symbol: m, v: 2, L: 4 * pp}
    most, alone = _torch_dualpipev(pp, m, 0)
    for index in range(pp):
        assert _torch_dualpipev(pp, m, index)[0] == most
    rank = PipelineRank(0, True, True)
    assert chunks_in_flight(vee, rank).subs(values) == most == 2 * pp + 1
    assert combined_alone(vee).subs(values) == sp.Rational(alone, 2 * m)


def test_dualpipev_holds_the_layers_once_and_idles_half_dualpipes_bubble_per_stage():
    """Rank 0 holds both ends and its layers once (two V-shaped stages); the bubble is
    DualPipe's over 2pp stages of half a rank's layers: (pp - 1)(F + 2B - 3W) / 2."""
    layout = {**PIPE, "pp_interleave": 2}
    vee = _estimate(LLAMA, layout, pp_schedule="dualpipev")
    f, b = (_value(vee, f"time_s.microbatch_{p}") for p in ("forward", "backward"))
    w = _weights(vee, layers=8)
    assert _value(vee, "time_s.bubble") == pytest.approx((4 - 1) * (f + 2 * b - 3 * w) / 2)
    end = ranks(ParallelSpec(**layout, pp_schedule="dualpipev"))[0]
    assert end.first and end.last
    plain = _estimate(LLAMA, layout)
    assert _value(vee, "memory_bytes_per_device.params") == pytest.approx(
        _value(plain, "memory_bytes_per_device.params"), rel=0.25)  # fmt: skip
    assert "DualPipeV" in assumptions(vee)


@pytest.mark.parametrize(
    ("layout", "train", "field"),
    [
        (PIPE, TRAIN, "pp_interleave"),
        ({**PIPE, "pp_interleave": 2}, TrainSpec(batch=28, seq=4096, grad_accum=7), "grad_accum"),
    ],
)
def test_what_dualpipev_refuses_is_refused_by_name(layout, train, field):
    with pytest.raises(SpecError, match="dualpipev") as err:
        _estimate(LLAMA, layout, train, pp_schedule="dualpipev")
    assert err.value.field == field
