"""Two-batch overlap in ``serve`` (``ServeSpec.batch_overlap``; SGLang's
``--enable-two-batch-overlap``, vLLM's ``--enable-dbo``): a step runs as two micro-batches,
each reading the weights its tokens reach, and the device waits only for what of the expert
dispatch and combine outlasts the other micro-batch's kernels, plus the share contention
serialises; what it cannot run is refused naming the field."""

from __future__ import annotations

import pytest

from costmodel import get_hardware, get_model
from costmodel.serving.estimate import act_bytes, decode_step, serve
from costmodel.serving.experts import alltoall_s, exposed_alltoall_s
from costmodel.specs.checks import SpecError
from costmodel.specs.serving import ServeSpec

H200 = get_hardware("h200")
DSV3 = get_model("deepseek-v3")
WIDE = dict(input=2000, output=500, batch=64, precision="fp8", tp=8, dp=4, ep=32,
            engine="sglang")  # fmt: skip


def _values(**changes) -> dict:
    return serve(DSV3, ServeSpec(**{**WIDE, **changes}), H200).values


def test_a_prefill_waits_for_what_outlasts_the_other_micro_batch():
    """The prefill's comm is its tp all-reduces plus the exposed all-to-alls: with overlap,
    max(0, A - K) + (1 - overlap) min(A, K) of the step's all-to-alls A beside its kernels K
    (the weights read twice); without, all of A."""
    plain, both = _values(), _values(batch_overlap=True)
    spec, on = ServeSpec(**WIDE), ServeSpec(**WIDE, batch_overlap=True)
    a2a = alltoall_s(DSV3, spec, H200, spec.batch * spec.input, act_bytes(spec))
    exposed = exposed_alltoall_s(a2a, _kernels(both), on, H200)
    assert 0 < exposed < a2a
    all_reduces = plain["time_s.prefill.comm"] - a2a
    assert both["time_s.prefill.comm"] == pytest.approx(all_reduces + exposed)
    assert both["time_s.ttft"] < plain["time_s.ttft"]


def _kernels(values: dict) -> float:
    """A prefill's kernels: the dense matmuls', the routed experts' and the attention core's
    rooflines, one after the other (a fused engine has no elementwise kernels of its own)."""
    return sum(
        max(values[f"time_s.prefill.{part}_compute"], values[f"time_s.prefill.{part}_memory"])
        for part in ("matmuls", "experts", "attention")
    )


def test_each_micro_batch_reads_the_weights_its_half_reaches():
    """A decode step of 2b sequences under overlap reads twice the weights a step of b reads
    alone (two micro-batches of b, each reaching the experts b tokens reach)."""
    half = decode_step(DSV3, ServeSpec(**{**WIDE, "batch": 32}), H200)
    both = decode_step(DSV3, ServeSpec(**WIDE, batch_overlap=True), H200)
    assert both["weight_bytes"] == pytest.approx(2 * half["weight_bytes"], rel=1e-12)
    assert both["expert_bytes"] == pytest.approx(2 * half["expert_bytes"], rel=1e-12)


def test_small_decode_batches_lose_and_large_prefills_gain():
    """The trade SGLang's documentation states (up to 2x throughput on large batches): at a
    few sequences a decode step is its weight reads, which overlap doubles."""
    small = dict(batch=4)
    assert _values(**small, batch_overlap=True)["time_s.tpot"] > _values(**small)["time_s.tpot"]
    assert _values(batch_overlap=True)["time_s.ttft"] < _values()["time_s.ttft"]


@pytest.mark.parametrize(
    ("changes", "phrase"),
    [({"ep": 8, "dp": 1}, "needs ep > tp"), ({"engine": "trtllm"}, "runs no two-batch overlap"),
     ({"batch_overlap": "yes"}, "true or false")],
)  # fmt: skip
def test_what_it_cannot_run_is_refused_by_name(changes, phrase):
    with pytest.raises(SpecError, match=phrase) as err:
        ServeSpec(**{**WIDE, "batch_overlap": True, **changes})
    assert err.value.field == "batch_overlap"


def test_the_answer_states_the_engines_flag():
    notes = serve(DSV3, ServeSpec(**WIDE, batch_overlap=True), H200).notes
    assert any("--enable-two-batch-overlap" in n for n in notes)
