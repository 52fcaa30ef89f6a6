"""The hand-written FSDP (issue 13, item 2) on 2 gloo ranks against single-process training:
fp32 bit for bit (own linear class and ``nn.Linear``, as the naive DDP), fp16 compute within
1e-4; fp32 shard gradients; replicated gradients identical on every rank."""

from __future__ import annotations

import pytest
import torch

from validate.distributed.launch import launch

STEPS = 3


def _runs(dtype: str) -> tuple[list[dict], dict]:
    from validate.distributed.fsdp_checks import fsdp_run

    ranks = launch(fsdp_run, 2, STEPS, dtype, timeout_s=180)
    return ranks, ranks[0]["reference"]


def test_fp32_equals_single_process_bit_for_bit():
    ranks, reference = _runs("fp32")
    for result in ranks:
        assert result["params"].keys() == reference.keys()
        for name, want in reference.items():
            assert torch.equal(result["params"][name], want), name
        for grad_shape, shape, dtype in result["grads"]:
            assert grad_shape == shape and dtype == torch.float32
    for name, grad in ranks[0]["replicated"].items():  # averaged: the same on every rank
        assert torch.equal(grad, ranks[1]["replicated"][name]), name
    assert any(k.startswith("norms.") for k in reference)  # replicated ones were checked


def test_plain_linear_layers_train_bit_for_bit_as_ddp_and_one_process():
    """issue 38: a model of plain ``nn.Linear`` layers in fp32 under the hand-written FSDP
    ends on the parameters, bit for bit, of the naive DDP and of one process summing the
    ranks' slices in their order; one process on the unsplit batch differs from both alike,
    by rounding (one matmul sums all rows where the ranks add two halves)."""
    from validate.distributed.fsdp_checks import ddp_run, fsdp_run

    fsdp = launch(fsdp_run, 2, STEPS, "fp32", "nn.Linear", timeout_s=180)
    ddp = launch(ddp_run, 2, STEPS, "nn.Linear", timeout_s=180)
    reference, unsplit = fsdp[0]["reference"], fsdp[0]["unsplit"]
    assert any(k.startswith("ups.") and k.endswith(".bias") for k in reference)
    gap = 0.0
    for name, want in reference.items():
        for result in (*fsdp, *ddp):
            assert torch.equal(result["params"][name], want), name
        gap = max(gap, (unsplit[name] - want).abs().max().item())
        torch.testing.assert_close(unsplit[name], want, rtol=1e-6, atol=1e-6)
    assert gap > 0  # so the split reference is the one that can be matched exactly


def test_fp16_compute_keeps_fp32_masters_and_gradients():
    ranks, reference = _runs("fp16")
    for result in ranks:
        for name, want in reference.items():
            got = result["params"][name]
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        assert all(dtype == torch.float32 for *_, dtype in result["grads"])


def test_only_two_or_more_dimensions_are_sharded():
    """Embedding and matmul weights (of any module class) are sharded; norms and biases
    replicated; a parameter shared by two modules is refused."""
    from validate.distributed.fsdp_checks import shard_layout

    (layout,) = launch(shard_layout, 1, timeout_s=120)
    assert set(layout["sharded"]) == {
        "embed.weight",
        "ups.0.weight",
        "ups.1.weight",
        "downs.0.weight",
        "downs.1.weight",
        "head.weight",
    }
    assert set(layout["replicated"]) == {
        "norms.0.weight",
        "norms.1.weight",
        "ups.0.bias",
        "ups.1.bias",
        "final.weight",
    }
    assert "shared by two modules" in layout["tied_error"]


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_holds_a_shard_of_the_weights(world):
    from validate.distributed.fsdp_checks import held_bytes

    results = launch(held_bytes, world, timeout_s=180)
    full, replicated = results[0]["full"], results[0]["replicated"]
    for r in results:
        assert r["sharded"] == pytest.approx(full / world, abs=4 * 6 * world)  # padding
        assert r["replicated"] == replicated


def test_weights_are_gathered_per_module_and_again_for_backward():
    """6 sharded weights gathered in forward and dropped after their module ran; the 5 a
    matmul saved for backward (not the embedding's: it saves indices) gathered again; one
    reduce-scatter per sharded weight."""
    from validate.distributed.fsdp_checks import collective_calls

    for result in launch(collective_calls, 2, timeout_s=180):
        assert result["calls"] == {"all_gather": 6 + 5, "reduce_scatter": 6}
        assert result["after_forward"] == {"live": 0, "attrs": 0}


def test_the_issue_60_model_is_bit_exact_where_any_data_parallel_run_can_be():
    """Issue 60's setting (embedding, RMSNorms, ReLU, head; 20 x 8 split 10 / 10; SGD; fp32,
    deterministic): the hand-written FSDP, the naive DDP and torch's DDP end one step on the
    same parameters bit for bit, and on those of one process adding the two halves'
    gradients; one process on the unsplit batch differs from all three alike, by rounding
    (``validate.distributed.exactness`` says why no reduction order can match it)."""
    from validate.distributed.exactness import rank_run

    ranks = launch(rank_run, 2, timeout_s=180)
    split, unsplit = ranks[0]["split"], ranks[0]["unsplit"]
    gap = 0.0
    for name, want in split.items():
        for rank in ranks:
            for kind in ("fsdp", "naive-ddp", "torch-ddp"):
                assert torch.equal(rank[kind][name], want), (kind, name)
        gap = max(gap, (unsplit[name] - want).abs().max().item())
    assert 0 < gap < 1e-7  # rounding, in the linears' weights and biases
