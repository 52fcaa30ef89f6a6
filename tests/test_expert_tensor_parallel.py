"""Experts on a mesh of their own (issue 36): Megatron-Core's expert tensor parallelism
(etp) and MoE parallel folding (ep over tp x dp, etp 1), and tp on an MoE model, which
were refused. Per-device bytes and all-to-all volumes in closed form for Mixtral-8x7B
under framework=megatron (bf16 weights, main gradients in the reduce dtype, distributed
optimizer)."""

from __future__ import annotations

import re

import pytest

from costmodel import ParallelSpec, SpecError, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.single.params import param_breakdown
from costmodel.symbols import values_for

H100 = get_hardware("h100-sxm")
MIXTRAL = get_model("mixtral-8x7b")
TRAIN = TrainSpec(batch=64, seq=4096, grad_accum=8)
PARTS = {k: int(e.subs(values_for(MIXTRAL))) for k, e in param_breakdown(MIXTRAL).items()}
SPLIT = PARTS["total"] - PARTS["norms"]  # every matrix splits over tp (norms replicated)


def _values(**layout) -> dict[str, float]:
    par = ParallelSpec(framework="megatron", sequence_parallel=layout.get("tp", 1) > 1, **layout)
    return estimate(MIXTRAL, TRAIN, par, H100).values


@pytest.mark.parametrize(("tp", "etp", "ep", "dp"), [(2, 2, 4, 4), (2, 1, 8, 4), (4, 1, 8, 2),
                                                     (2, 2, 2, 4)])  # fmt: skip
def test_each_device_holds_its_tp_share_and_its_expert_groups_share_of_the_experts(tp, etp, ep, dp):
    """bf16 weights and their bf16 gradient buffer (gradients reduced in bf16, Megatron's
    default here; the fp32 copy of the optimizer's shard, made for the step, apart): the dense
    matrices over tp,
    norms on every rank, and 1/(ep·etp) of the routed experts (the router is a dense
    matrix here: split over tp too)."""
    values = _values(tp=tp, etp=etp, ep=ep, dp=dp)
    routed = PARTS["experts"]
    local = (SPLIT - routed) / tp + PARTS["norms"] + routed / (ep * etp)
    assert values["memory_bytes_per_device.params"] == pytest.approx(2 * local, rel=1e-12)
    shard = values["memory_bytes_per_device.master"]  # fp32: 4 bytes per shard parameter
    assert values["memory_bytes_per_device.grads"] == pytest.approx(2 * local, rel=1e-12)
    assert values["memory_bytes_per_device.step_grads"] == pytest.approx(shard, rel=1e-12)


def test_fsdp2_runs_the_experts_over_tp_as_torchtitan_and_maxtext_do():
    """tp on an MoE model under fsdp2 (torchtitan's etp = tp or 1; MaxText's tensor axis, as
    the Llama 4 Maverick tpu-recipe runs it: fsdp 32 x tp 4) was refused. Without
    sequence parallelism (Megatron's requirement only), each replica holds its fp32
    master parameters over tp, the routed experts over ep x etp: every matrix but the norms halves
    from tp 1 to tp 2, whether the experts split over tp (etp 2) or over ep (ep 2, etp 1)."""
    train = TrainSpec(batch=64, seq=4096, grad_accum=8)

    def params(**layout) -> float:
        par = ParallelSpec(framework="fsdp2", **layout)
        return estimate(MIXTRAL, train, par, H100)["memory_bytes_per_device.master"]

    one, two = params(dp=8), params(dp=4, tp=2)  # replicas: no FSDP padding of the shards
    assert one == pytest.approx(4 * PARTS["total"], rel=1e-12)
    assert two == pytest.approx(4 * (SPLIT / 2 + PARTS["norms"]), rel=1e-12)
    assert params(dp=4, tp=2, ep=2, etp=1) == pytest.approx(two, rel=1e-12)


def test_folding_and_expert_tensor_parallelism_hold_the_same_expert_share():
    """ep 8 x etp 1 and ep 4 x etp 2 on the same tp 2 x dp 4: each device holds 1/8 of the
    routed experts either way; the optimizer state of the experts spreads over the
    expert-data-parallel ranks (1 either way here)."""
    folded, etp = _values(tp=2, etp=1, ep=8, dp=4), _values(tp=2, etp=2, ep=4, dp=4)
    for key in ("params", "grads", "master", "optimizer"):
        key = f"memory_bytes_per_device.{key}"
        assert folded[key] == pytest.approx(etp[key], rel=1e-12)


def test_each_tp_rank_dispatches_its_sequence_shard_and_etp_ranks_gather():
    """Per MoE block and micro-batch, four all-to-alls (dispatch and combine, forward and
    backward) of the device's b·T/tp tokens times k = 2 copies of D bf16 values, (ep - 1)/ep
    leaving the rank; with etp > 1 the pairs an expert group receives are gathered over
    its etp ranks ((etp - 1)/etp of etp times what it received) and reduce-scattered back."""
    tokens = 64 // 4 * 4096  # per data-parallel rank per step (dp 4)
    for tp, etp, ep in ((2, 1, 8), (2, 2, 4), (1, 1, 4)):
        values = _values(tp=tp, etp=etp, ep=ep, dp=8 // tp if tp == 1 else 4)
        pairs = 2 * (tokens if tp > 1 else 64 // 8 * 4096) / tp * 2 * 4096
        one = pairs * (ep - 1) / ep + pairs * (etp - 1)
        assert values["comm_bytes.ep"] == pytest.approx(32 * 4 * one, rel=1e-12), (tp, etp, ep)


@pytest.mark.parametrize(
    ("layout", "field", "message"),
    [
        ({"tp": 2, "dp": 4, "ep": 8, "etp": 1}, "sequence_parallel",
         "a mixture-of-experts model under tp > 1 needs sequence_parallel"),
        ({"tp": 2, "dp": 4, "ep": 8, "etp": 2, "sequence_parallel": True}, "ep",
         "ep * etp must divide tp * dp * fsdp * cp"),
        ({"tp": 2, "dp": 4, "ep": 4, "etp": 3, "sequence_parallel": True}, "etp",
         "etp must divide d_ff_expert"),
        ({"tp": 2, "fsdp": 4, "ep": 8, "etp": 1, "sequence_parallel": True,
          "framework": "deepspeed"}, "tp", "is modelled under framework=fsdp2 or megatron"),
        ({"tp": 4, "fsdp": 2, "ep": 2, "etp": 2, "framework": "fsdp2"}, "etp",
         "etp must be 1 or tp (got etp=2, tp=4)"),
    ],
)  # fmt: skip
def test_a_layout_megatron_refuses_names_the_field_and_its_rule(layout, field, message):
    par = ParallelSpec(**{"framework": "megatron", **layout})
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        estimate(MIXTRAL, TRAIN, par, H100)
    assert err.value.field == field


def test_etp_defaults_to_tp_follows_it_and_needs_experts():
    assert ParallelSpec(tp=4).etp == 4 and ParallelSpec(tp=4).replace(tp=2).etp == 2
    assert ParallelSpec(tp=4, etp=1).replace(tp=2).etp == 1
    with pytest.raises(SpecError, match=r"etp .* needs a mixture-of-experts model") as err:
        estimate(get_model("llama3-8b"), TRAIN, ParallelSpec(dp=2, tp=4, etp=1), H100)
    assert err.value.field == "etp"


def test_a_folded_published_layout_is_stated_and_costed():
    """Qwen3-235B-A22B on 256 H100 (Megatron-Bridge 26.02: tp 2, pp 8 x 4, ep 32 over
    tp x dp 16, etp 1) was refused ("ep must divide dp * fsdp * cp")."""
    model = get_model("qwen3-30b-a3b", n_layers=94, d_model=4096, n_heads=64, n_kv_heads=4,
                      head_dim=128, d_ff=12288, d_ff_expert=1536)  # fmt: skip
    par = ParallelSpec(framework="megatron", tp=2, sequence_parallel=True, pp=8,
                       pp_interleave=4, dp=16, ep=32, etp=1)  # fmt: skip
    est = estimate(model, TrainSpec(batch=8192, seq=4096, grad_accum=512), par, H100)
    assert est["memory_bytes_per_device.peak"] > 0 and est["comm_bytes.ep"] > 0
