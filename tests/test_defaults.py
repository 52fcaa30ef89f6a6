"""Issue 35, item 2: what is not given is taken as the named framework runs it, and said.

FSDP2, DeepSpeed and the hand-written FSDP shard over every data-parallel device unless a
sharding degree is given; every framework runs one sequence per device per micro-batch with
the rest of the batch accumulated unless a micro-batch or accumulation is given; a pipeline
with fewer micro-batches than stages is warned of. The CLI, the app and ``inputs.build``
take the same defaults (they share ``build``)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from costmodel.cli import main
from costmodel.inputs import build

LLAMA8 = {"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8, "seq": 8192, "batch": 64}


def _json(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("framework", ["fsdp2", "deepspeed", "handwritten"])
def test_sharding_frameworks_shard_over_every_data_parallel_device(framework):
    extra = {"recompute": "full"} if framework != "handwritten" else {"tied": False}
    setup = build({**LLAMA8, "framework": framework, **extra})
    assert (setup.parallel.dp, setup.parallel.fsdp) == (1, 8)
    assert any(f"{framework} shards over all 8" in n for n in setup.notes)


@pytest.mark.parametrize("framework", ["reference", "megatron"])
def test_the_others_replicate(framework):
    """DDP replicas; Megatron's distributed optimizer shards over them by itself."""
    setup = build({**LLAMA8, "framework": framework})
    assert (setup.parallel.dp, setup.parallel.fsdp) == (8, 1)
    assert not any("shards over" in n for n in setup.notes)


def test_a_given_sharding_degree_or_dp_is_kept():
    assert build({**LLAMA8, "framework": "fsdp2", "fsdp": 4}).parallel.dp == 2  # HSDP
    setup = build({**LLAMA8, "framework": "fsdp2", "dp": 8})
    assert (setup.parallel.dp, setup.parallel.fsdp) == (8, 1)


def test_fsdp2_without_fsdp_fits_where_it_used_not_to():
    """Issue 35: ``--framework fsdp2`` without ``--fsdp`` kept dp 8 and 176 GiB a device."""
    data = _json("--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                 "--framework", "fsdp2", "--seq", "8192", "--batch", "8")  # fmt: skip
    assert data["verdict"]["fits"], data["verdict"]["summary"]
    assert "FSDP over 8" in data["verdict"]["layout"]


def test_zero_1_under_deepspeed_shards_the_optimizer_state():
    """Issue 35: ``--zero 1`` under DeepSpeed did nothing (no shard group by default)."""
    args = ("--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--seq", "4096",
            "--batch", "8", "--framework", "deepspeed", "--recompute", "full")  # fmt: skip
    one, three = _json(*args, "--zero", "1"), _json(*args, "--zero", "3")
    opt = {z: d["memory_bytes_per_device"]["optimizer"] for z, d in ((1, one), (3, three))}
    assert opt[1] == opt[3]  # the optimizer state over the 8 devices under both stages
    full = _json(*args, "--dp", "8")["memory_bytes_per_device"]["optimizer"]  # DDP: whole
    assert opt[1] == pytest.approx(full / 8)


def test_micro_batch_one_by_default_and_said():
    setup = build(LLAMA8)
    assert setup.train.grad_accum == 8  # 64 sequences over 8 replicas, one at a time
    assert any("micro-batch 1 per device, 8 accumulation steps" in n for n in setup.notes)
    given = build({**LLAMA8, "microbatch": 4})
    assert given.train.grad_accum == 2 and not any("micro-batch 1" in n for n in given.notes)
    assert build({**LLAMA8, "grad_accum": 1}).train.grad_accum == 1  # stated: kept


def test_a_pipeline_with_fewer_micro_batches_than_stages_is_warned_of():
    """Issue 35: Llama-3-405B on 1,024 GPUs with pp 16 ran the whole local batch as one
    micro-batch (259 s of a 279 s step in the bubble); by default it now runs one sequence
    at a time, and a batch too small for the pipeline is warned of."""
    big = {"model": "llama3-405b", "hardware": "h100-sxm", "gpus": 1024, "tp": 8, "pp": 16,
           "seq": 8192, "batch": 2048, "framework": "megatron", "recompute": "full"}  # fmt: skip
    est = build(big).estimate()
    assert est["time_s.bubble"] / est["time_s.step"] < 0.1  # 15 / 256 of the compute
    small = build({**big, "batch": 64})
    assert small.train.grad_accum == 8
    assert any("8 micro-batches for 16 pipeline stages: each stage idles 50%" in n
               for n in small.notes)  # fmt: skip


def test_the_cli_prints_the_notes_with_the_verdict():
    data = _json("--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                 "--framework", "fsdp2", "--seq", "8192", "--batch", "64")  # fmt: skip
    notes = data["verdict"]["notes"]
    assert any("fsdp2 shards over all 8" in n for n in notes)
    assert any("micro-batch 1 per device" in n for n in notes)


def test_an_unset_zero_is_the_frameworks_own_stage_and_follows_it():
    """Issue 60: ``--zero 3`` under Megatron over replicas was taken as the unset default
    (and priced as the distributed optimizer); unset is now the framework's own stage."""
    from costmodel import ParallelSpec

    assert ParallelSpec().zero == 3 and ParallelSpec(framework="megatron", dp=8).zero == 1
    fsdp = ParallelSpec(framework="megatron", fsdp=8)
    assert fsdp.zero == 3  # Megatron-FSDP
    assert fsdp.replace(fsdp=1, dp=8).zero == 1
    assert fsdp.replace(framework="deepspeed").zero == 3
    assert ParallelSpec(framework="deepspeed", zero=2, fsdp=8).replace(fsdp=4).zero == 2
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                     "--framework", "megatron", "--zero", "3"])  # fmt: skip
    assert code == 2 and "zero must be 1 (got 3)" in err.getvalue()


def test_megatron_fsdp_shards_parameters_and_gradients():
    """Megatron-FSDP (zero 3 over --fsdp ranks) holds 1/fsdp of the bf16 parameters and of
    the gradient buffer, where the distributed optimizer keeps both whole."""
    args = ("--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--seq", "4096",
            "--batch", "8", "--framework", "megatron")  # fmt: skip
    dist, fsdp = _json(*args, "--dp", "8"), _json(*args, "--fsdp", "8", "--dp", "1")
    assert "Megatron-FSDP (ZeRO-3) over fsdp 8" in fsdp["verdict"]["layout"]
    for part in ("params", "grads"):
        whole = dist["memory_bytes_per_device"][part]
        assert fsdp["memory_bytes_per_device"][part] == pytest.approx(whole / 8, rel=1e-3)
    assert (
        fsdp["memory_bytes_per_device"]["optimizer"] == dist["memory_bytes_per_device"]["optimizer"]
    )


def test_the_json_of_a_layout_that_does_not_fit_has_no_mfu():
    """Issue 60's probe: the text gives no MFU for a layout that does not fit, the JSON
    gave 0.364; now null, as the text (the step time stays, as --full prints it)."""
    data = _json("--model", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--tp", "8",
                 "--pp", "2", "--seq", "8192", "--batch", "64")  # fmt: skip
    assert data["verdict"]["fits"] is False
    assert data["mfu"] is None and data["hfu"] is None and data["tflops_per_device"] is None
    assert data["time_s"]["step"] > 0


def test_the_json_memory_parts_add_up_to_the_peak():
    """Issue 60's probe: the text's transients line had no JSON key, so the JSON's parts
    summed to 24.7 of a 34.2 GB peak."""
    from costmodel.engine.fit import MEMORY_PARTS

    data = _json("--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fsdp", "8",
                 "--framework", "fsdp2", "--seq", "8192", "--batch", "32",
                 "--recompute", "full")  # fmt: skip
    mem = data["memory_bytes_per_device"]
    total = sum(mem.get(k) or 0 for k in (*MEMORY_PARTS, "transients"))
    assert mem["transients"] > 0 and total == pytest.approx(mem["peak"], rel=1e-12)


def test_each_frameworks_own_stage_over_arrays_is_its_per_layout_one():
    """A sweep's million rows take each framework's own stage from its few degrees
    (``specs.frameworks.own_stage``), the stage one ParallelSpec would hold row by row."""
    import numpy as np

    from costmodel.specs.frameworks import FRAMEWORKS, own_stage

    rng = np.random.default_rng(60)
    names = rng.choice(FRAMEWORKS, 500)
    degrees = rng.choice([1, 2, 3, 8, 64], 500)
    expected = [own_stage(str(n), int(d)) for n, d in zip(names, degrees, strict=True)]
    assert own_stage(names, degrees).tolist() == expected
    one = own_stage(np.array(["megatron"]), np.array([[1, 8], [2, 1]]))
    assert one.tolist() == [[1, 3], [3, 1]] and own_stage(np.array([], str), []).size == 0


def test_a_tp_group_across_nodes_is_noted():
    """Issue 60's sixth probe: tp 16 on 8-GPU nodes was priced over the network unsaid
    (bounds warned of an fsdp group across nodes, estimate said nothing of tp's)."""
    setup = build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 16, "tp": 16,
                   "batch": 16})  # fmt: skip
    assert any(n.startswith("tp 16 spans 2 nodes of 8 GPUs") for n in setup.notes)
    inside = build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 16, "tp": 8,
                    "batch": 16})  # fmt: skip
    assert not any("spans" in n for n in inside.notes)
