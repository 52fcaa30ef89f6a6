"""Combined 1F1B (``ParallelSpec.ep_overlap``; Megatron-Core's
``--overlap-moe-expert-parallel-comm``): one micro-batch's expert-parallel all-to-alls run
beside another micro-batch's compute, so only the passes that run alone wait for theirs;
interleaved pipelining keeps one warm-up chunk more; what Megatron refuses to run it with
is refused, naming the field."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlparse

import numpy as np
import pytest

from costmodel import ParallelSpec, TrainSpec, estimate, get_model, sweep
from costmodel.catalog.hardware import get_hardware
from costmodel.engine.timeline import segments
from costmodel.parallel.pipeline import PipelineRank, chunks_in_flight
from costmodel.specs.checks import SpecError
from costmodel.symbols import N_pp, m, v
from explorer.plan_charts import estimate_link
from explorer.state import from_query, setup_of

H100 = get_hardware("h100-sxm")
MIXTRAL = get_model("mixtral-8x7b")
TRAIN = TrainSpec(batch=64, seq=4096, grad_accum=8, recompute="selective")
FLAT = {"dp": 8, "ep": 8, "framework": "megatron"}
INTERLEAVED = {"dp": 2, "pp": 4, "pp_interleave": 2, "ep": 2, "framework": "megatron"}


def _values(layout: dict, **changes) -> dict[str, float]:
    par = ParallelSpec(**layout, **changes)
    return {k: float(x) for k, x in estimate(MIXTRAL, TRAIN, par, H100).values.items()}


def test_without_pipelining_the_first_forward_and_last_backward_wait_for_theirs():
    """m - 1 combined steps hide m - 1 of the m micro-batches' all-to-alls: the step is
    shorter by that share of them, less the 1 - overlap of them that contention serialises
    (``Hardware.overlap``; the overlapped traffic stays under the compute here), moves the
    same bytes and holds the same memory."""
    plain, combined = _values(FLAT), _values(FLAT, ep_overlap=True)
    micro = TRAIN.grad_accum
    assert plain["comm_exposed_share.ep"] == 1
    assert combined["comm_exposed_share.ep"] == pytest.approx(1 / micro, rel=1e-15)
    assert combined["comm_bytes.ep"] == plain["comm_bytes.ep"] > 0
    saved = plain["time_s.step"] - combined["time_s.step"]
    hidden = (1 - 1 / micro) * plain["comm_time_s.ep"]
    assert saved == pytest.approx(H100.overlap * hidden, rel=1e-9)
    assert combined["memory_bytes_per_device.peak"] == plain["memory_bytes_per_device.peak"]


def test_interleaved_pipelining_runs_its_warm_up_alone():
    """The first rank runs (v - 1)·m_r + 2(pp - 1) warm-up forwards under interleaved 1F1B,
    one more under combined 1F1B, alone, and as many cool-down backwards: 4 + 6 + 1 = 11
    of its m·v = 16 chunks at pp 4, v 2, m 8 (m_r = pp = 4 micro-batches a round)."""
    combined = _values(INTERLEAVED, ep_overlap=True)
    assert combined["comm_exposed_share.ep"] == pytest.approx(11 / 16, rel=1e-15)
    plain = _values(INTERLEAVED)
    saved = plain["time_s.step"] - combined["time_s.step"]
    assert saved == pytest.approx(H100.overlap * 5 / 16 * plain["comm_time_s.ep"], rel=1e-9)


@pytest.mark.parametrize(("micro", "more"), [(8, 1), (64, 1), (2, 0)])
def test_the_extra_warm_up_forward_keeps_one_chunk_more(micro, more):
    """Megatron adds a warm-up forward so that each steady step's forward and backward are
    of different micro-batches: one more chunk in flight, none past the m·v chunks."""
    first = PipelineRank(0, True, False)
    at = {m: micro, v: 2, N_pp: 4}
    plain, combined = (
        chunks_in_flight(ParallelSpec(**INTERLEAVED, ep_overlap=flag), first).subs(at)
        for flag in (False, True)
    )
    assert combined - plain == more
    assert (
        _values(INTERLEAVED, ep_overlap=True)["memory_bytes_per_device.peak"]
        > (_values(INTERLEAVED)["memory_bytes_per_device.peak"])
    )


@pytest.mark.parametrize("layout", [FLAT, INTERLEAVED], ids=["flat", "interleaved"])
def test_timeline_draws_the_hidden_all_to_alls_beside_the_compute(layout):
    """The timeline adds up to the step and splits the all-to-alls as the step does."""
    values = _values(layout, ep_overlap=True)
    segs = segments(values, ParallelSpec(**layout, ep_overlap=True))
    assert max(s.end for s in segs) == pytest.approx(values["time_s.step"], rel=1e-12)
    share = values["comm_exposed_share.ep"]
    for phase in ("forward", "backward"):
        total = values[f"comm_phase_s.ep.{phase}"]
        shown = [s.seconds for s in segs if s.label == f"EP {phase}" and s.kind == "exposed"]
        hidden = [s.seconds for s in segs if s.label == f"EP {phase}" and s.kind == "comm"]
        assert shown == [pytest.approx(share * total, rel=1e-12)]
        assert hidden == [pytest.approx((1 - share) * total, rel=1e-12)]


def test_sweep_agrees_with_estimate():
    """A sweep over micro-batch counts under combined 1F1B gives estimate's numbers."""
    grid = sweep(MIXTRAL, hardware=H100, batch=64, seq=4096, recompute="selective",
                 grad_accum=np.array([2, 4, 8]), **FLAT, ep_overlap=True)  # fmt: skip
    for i, micro in enumerate((2, 4, 8)):
        train = TrainSpec(batch=64, seq=4096, grad_accum=micro, recompute="selective")
        par = ParallelSpec(**FLAT, ep_overlap=True)
        want = estimate(MIXTRAL, train, par, H100).values["time_s.step"]
        assert float(grid["time_s.step"][i]) == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize(
    ("layout", "recompute", "field", "message"),
    [
        ({"dp": 8, "framework": "megatron"}, "none", "ep_overlap", "needs ep > 1"),
        ({"dp": 8, "ep": 8, "framework": "fsdp2"}, "none", "ep_overlap", "framework=megatron"),
        ({**INTERLEAVED, "pp_interleave": 1}, "none", "ep_overlap", "pp_interleave > 1"),
        (FLAT, "full", "recompute", "recompute=full"),
    ],
)
def test_what_megatron_refuses_names_the_field(layout, recompute, field, message):
    train = TrainSpec(batch=64, seq=4096, grad_accum=8, recompute=recompute)
    par = ParallelSpec(**layout, ep_overlap=True)
    with pytest.raises(SpecError, match=message) as err:
        estimate(MIXTRAL, train, par, H100)
    assert err.value.field == field
    with pytest.raises(SpecError, match=message):
        sweep(MIXTRAL, hardware=H100, batch=np.array([64, 128]), seq=4096, grad_accum=8,
              recompute=recompute, **layout, ep_overlap=True)  # fmt: skip


def test_the_planner_tries_each_megatron_layout_with_and_without_it():
    """Every Megatron candidate Megatron could run combined 1F1B with is searched twice;
    with it, the step is never longer (the same work, fewer exposed all-to-alls), and the
    label and the spec the planner hands back carry it."""
    from costmodel.engine.plan import PlanOptions, layout_label, plan

    options = PlanOptions(frameworks=("megatron",), recompute=("selective", "full"),
                          micro_batches=(1,), interleave=(1, 2))  # fmt: skip
    found = plan(MIXTRAL, TrainSpec(batch=32, seq=4096), H100, 16, options)
    cols, step = found.columns, found.values["time_s.step"]
    overlap = cols["ep_overlap"]
    assert overlap.any() and (~overlap).any()
    eligible = (cols["ep"] > 1) & (cols["recompute"] != "full")
    eligible &= (cols["pp"] == 1) | (cols["pp_interleave"] > 1)
    assert not (overlap & ~eligible).any()
    keys = ("dp", "tp", "pp", "pp_interleave", "cp", "ep", "etp", "micro_batch", "recompute")
    without = {tuple(cols[k][i] for k in keys): step[i] for i in np.flatnonzero(~overlap)}
    for i in np.flatnonzero(overlap):
        assert step[i] <= without[tuple(cols[k][i] for k in keys)]
    i = int(np.flatnonzero(overlap)[0])
    assert found.parallel_spec(i).ep_overlap and "+a2a-overlap" in layout_label(found.row(i))
    # the plan page's link opens the Estimate page on the same layout, overlap included
    link = estimate_link(found, i, "mixtral-8x7b")
    values, problems = from_query(dict(parse_qsl(urlparse(link).query)))
    setup, errors = setup_of(values)
    assert not problems and not errors and setup.parallel.ep_overlap
    assert setup.estimate().values["time_s.step"] == pytest.approx(step[i], rel=1e-12)
    # and on a folded mesh (ep over tp x dp, the experts unsplit: Megatron's parallel folding)
    folded = np.flatnonzero((cols["etp"] == 1) & (cols["tp"] > 1) & (cols["ep"] > 1))
    assert len(folded)
    i = int(folded[0])
    assert "etp1" in layout_label(found.row(i))
    values, problems = from_query(
        dict(parse_qsl(urlparse(estimate_link(found, i, "mixtral-8x7b")).query))
    )
    setup, errors = setup_of(values)
    assert not problems and not errors and setup.parallel.etp == 1
    assert setup.estimate().values["time_s.step"] == pytest.approx(step[i], rel=1e-12)
