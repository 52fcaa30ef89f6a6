"""The app's charts as issue 60's fifth probe read them: ops in words, axes as numbers and
money, overlapping phases side by side, the compute-bound batch with what it holds."""

from __future__ import annotations

import itertools


def test_charts_name_the_ops_in_words():
    """Issue 60's probe: the FLOP chart's legend read ``attn_q``, ``attn_scores``."""
    from explorer import charts

    v = {"flops.forward_by_op.attn_q": 1e12, "flops.forward_by_op.attn_scores": 2e12,
         "flops.forward_by_op.lm_head": 3e12, "flops.forward_by_op.new_op": 1e12}  # fmt: skip
    ops = {r["op"] for r in charts.flops_chart(v).to_dict()["data"]["values"]}
    assert ops == {"Q projection", "attention scores (Q K^T)", "LM head", "new op"}


def test_chart_axes_read_as_numbers_and_money():
    """Issue 60's probe: the sizing chart's cost axis printed raw dollars with decimals and
    the roofline's log axes 1e+15: money and GPU-hours now read $1.2M and 12k, FLOP/s 1P."""
    from costmodel.engine.sizing import Size
    from explorer import plan_charts

    rows = [Size(0, g, 1e5, 30 / g, 1e5, 2.5e6 / g) for g in (64, 128)]
    spec = str(plan_charts.sizing_chart(rows, None).to_dict())
    assert "'format': '$,.3~s'" in spec
    no_price = [Size(0, g, 1e5, 30 / g, 1e5, None) for g in (64, 128)]
    assert "'format': ',.3~s'" in str(plan_charts.sizing_chart(no_price, None).to_dict())


def test_overlapping_phases_are_drawn_side_by_side_and_the_crossover_says_what_it_holds():
    """Issue 60's fifth probe: the offload page stacked compute and both link directions
    (which run at once) end to end, and the compute-bound batch moved when used: it grows
    the micro-batch at the accumulation steps held, which the chart now says."""
    from costmodel.inputs import build
    from explorer import charts
    from explorer.workloads import _bars

    phases = {"forward": {"compute": 1.0, "host->device": 0.5}}
    side = _bars(phases, "s", "t", stacked=False).to_dict()
    assert side["encoding"]["yOffset"]["field"] == "part" and side["encoding"]["x"]["stack"] is None
    stacked = _bars(phases, "GB", "t").to_dict()
    assert stacked["encoding"]["x"]["stack"] == "zero" and "yOffset" not in stacked["encoding"]
    setup = build({"model": "llama3-8b", "gpus": 64, "batch": 64, "seq": 512,
                   "framework": "fsdp2", "hardware": "a100-40gb"})  # fmt: skip
    title = charts.comm_chart(setup, [64 * 2**k for k in range(6)]).to_dict()["title"]
    assert "grad-accum 1 held" in title
    if "compute-bound from batch" in title:
        cross = int(title.split("compute-bound from batch ")[1].split(" ")[0])
        assert f"micro-batch {cross // 64} per device" in title


def test_the_roofline_ticks_every_decade():
    """Issue 60's sixth probe: the roofline's log axes were ticked 1T, 3T, 20T, 100T, 300T,
    none near the roof; now at every power of ten from below the lowest op to above the
    roof."""
    from costmodel.inputs import build
    from explorer import charts

    setup = build({"model": "llama3-8b", "gpus": 8, "fsdp": 8, "framework": "fsdp2",
                   "hardware": "h100-sxm"})  # fmt: skip
    spec = charts.roofline_chart(setup, setup.estimate().values).to_dict()
    axis = spec["layer"][0]["encoding"]["y"]["axis"]["values"]
    assert all(abs(b / a - 10) < 1e-9 for a, b in itertools.pairwise(axis))
    compute, _ = charts._roof(setup)
    assert axis[-1] >= compute > axis[-2]
    assert charts.decades(0.3, 2e3) == [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]


def test_legends_list_only_what_is_drawn():
    """Issue 60's seventh probe: the Estimate memory legends listed "frozen" and "buffers"
    at 0 GiB and the Plan timeline "pipeline bubble" without pp; each lists what has a bar,
    in the colour it keeps wherever it is drawn."""
    from costmodel.engine.timeline import segments
    from costmodel.inputs import build
    from explorer import charts, plan_charts

    setup = build({"model": "cs336-2.7b", "hardware": "h100-sxm", "gpus": 1})
    spec = charts.memory_chart(setup, "batch", [1, 2, 4]).to_dict()
    (scale,) = [layer["encoding"]["color"]["scale"] for layer in spec["layer"]
                if "color" in layer.get("encoding", {})]  # fmt: skip
    assert "frozen" not in scale["domain"] and "buffers" not in scale["domain"]
    order = [*charts.MEMORY_PARTS, "transient"]
    assert scale["range"] == [charts.TABLEAU[order.index(c) % 10] for c in scale["domain"]]
    segs = segments(setup.estimate().values, setup.parallel)
    kinds = plan_charts.timeline_chart(segs).to_dict()["encoding"]["color"]["scale"]["domain"]
    assert "pipeline bubble" not in kinds and kinds


def test_one_devices_time_chart_draws_and_the_batch_chart_says_what_it_holds():
    """Round eight: on one GPU the communication line is 0, which a log axis cannot draw, so
    the Time tab's first chart came out empty; the memory-vs-batch chart held 4 accumulation
    steps unsaid, drawing batch 32 over the device where the page's batch 32 fits."""
    from costmodel.inputs import build
    from explorer import charts

    setup = build({"model": "cs336-2.7b", "hardware": "h100-sxm", "gpus": 1})
    data = charts.comm_chart(setup, [4, 8, 16]).to_dict()
    drawn = data.get("data", data.get("layer", [{}])[0].get("data"))["values"]
    assert drawn and all(r["seconds"] > 0 for r in drawn)
    title = charts.memory_chart(setup, "batch", [1, 2, 4]).to_dict()["title"]
    assert "grad-accum 4 held" in str(title)
