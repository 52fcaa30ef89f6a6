"""Ring attention by hand (validate.distributed.context) equals attention over the whole
sequence, on 2 and 3 gloo ranks, causal and not, with grouped K/V heads, through the
fused CPU kernel and the math path; and costmodel reduces gradients over the cp ranks
(issue 13, item 1: context parallelism)."""

from __future__ import annotations

import pytest

from costmodel import ParallelSpec, TrainSpec, estimate, get_hardware, get_model
from validate.distributed.context import model_check, ring_check
from validate.distributed.launch import launch


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "math"])
def test_ring_attention_equals_whole_sequence_attention(world: int, causal: bool, fused: bool):
    """Output and the Q, K, V gradients of each rank's chunk against SDPA on the whole
    sequence, fp32: within 1e-5 (measured: at most 1.7e-6)."""
    for rank, diffs in enumerate(launch(ring_check, world, causal, fused)):
        for name, diff in diffs.items():
            assert diff < 1e-5, (rank, name, diff)


@pytest.mark.parametrize("world", [2, 4])
def test_model_under_context_parallelism_equals_the_whole_sequence(world: int) -> None:
    """The reference model with ring attention and RoPE at each chunk's positions: the mean
    of the ranks' losses is the whole batch's and the averaged gradients are its gradients
    (fp32; measured: loss exact, gradients within 3e-8)."""
    for rank, diffs in enumerate(launch(model_check, world)):
        assert diffs["loss"] < 1e-6 and diffs["grads"] < 1e-6, (rank, diffs)


@pytest.mark.parametrize("framework", ["reference", "megatron"])
def test_context_parallel_ranks_reduce_their_gradients(framework: str) -> None:
    """The cp ranks hold the same parameters and see different chunks of each sequence, so
    the data-parallel all-reduce spans dp x cp (Megatron: the dp-cp group). Llama-3-8B with
    dp 4 x cp 2 sends what dp 8 sends; with dp 1 x cp 2 the gradients are still summed over
    the two ranks (2(N-1)/N = 1 x the gradient bytes), where it was once nothing."""
    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    train = TrainSpec(batch=8, seq=8192, precision="bf16-mixed")

    def dp_bytes(**degrees: int) -> float:
        par = ParallelSpec(framework=framework, **degrees)
        return estimate(model, train, par, hw)["comm_bytes.dp"]

    assert dp_bytes(dp=4, cp=2) == pytest.approx(dp_bytes(dp=8))
    fp32 = ParallelSpec(framework=framework).grad_reduce_fp32  # the framework's own dtype
    grads = estimate(model, train.replace(batch=1), None)["params.total"] * (4 if fp32 else 2)
    assert dp_bytes(cp=2) == pytest.approx(grads)
