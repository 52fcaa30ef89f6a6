"""Pipeline splits as Megatron-Core runs them (issue 36): the embedding and the loss may
each take a layer's place (``--account-for-{embedding,loss}-in-pipeline-split``), and an
MoE model's dense leading blocks lie on whichever stages hold them, not only the first.
Checked by hand against the split of every rank, and end to end on layouts published MoE
runs use (Qwen3-235B's 94 blocks over pp 8 x 4; DeepSeek-V3's 3 dense blocks under
pp 16 x 2), which were refused before."""

from __future__ import annotations

import re

import pytest
import sympy as sp

from costmodel import ParallelSpec, SpecError, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.config import check
from costmodel.parallel.pipeline import PipelineRank, leading_layers, rank_layers
from costmodel.specs.pipeline import first_round_layers
from costmodel.symbols import L, N_pp, v

H100 = get_hardware("h100-sxm")


def _split(par: ParallelSpec, layers: int, dense: int = 0) -> list[tuple[int, int]]:
    """(blocks, dense leading blocks) on every pipeline rank, from the expressions."""
    out = []
    for i in range(par.pp):
        rank = PipelineRank(i, i == 0, i == par.pp - 1)
        values = {L: layers, N_pp: par.pp, v: par.pp_interleave}
        blocks = int(rank_layers(par, rank).subs(values))
        out.append((blocks, int(leading_layers(par, rank, sp.Integer(dense)).subs(values))))
    return out


@pytest.mark.parametrize(
    ("layers", "pp", "v", "emb", "loss", "expected"),
    [
        (94, 8, 4, True, True, [11, 12, 12, 12, 12, 12, 12, 11]),  # Qwen3-235B: 96 slots of 3
        (94, 8, 4, False, False, [12, 12, 12, 12, 12, 12, 11, 11]),  # the spare ones first
        (31, 4, 1, True, False, [7, 8, 8, 8]),
        (31, 4, 1, False, True, [8, 8, 8, 7]),
        (32, 4, 1, False, False, [8, 8, 8, 8]),
    ],
)
def test_each_rank_holds_its_slots_less_the_embedding_and_the_loss(layers, pp, v, emb, loss,
                                                                   expected):  # fmt: skip
    par = ParallelSpec(pp=pp, pp_interleave=v, pp_split_embedding=emb, pp_split_loss=loss)
    got = [blocks for blocks, _ in _split(par, layers)]
    assert got == expected and sum(got) == layers


@pytest.mark.parametrize(
    ("layers", "pp", "v", "emb", "dense", "expected"),
    [
        (61, 16, 2, False, 3, [2, 1] + [0] * 14),  # DeepSeek-V3: the first stages hold 2
        (61, 16, 1, False, 3, [3] + [0] * 15),
        (31, 4, 1, True, 9, [7, 2, 0, 0]),  # the embedding's slot leaves the first stage 7
        (28, 4, 1, False, 1, [1, 0, 0, 0]),
    ],
)
def test_dense_leading_blocks_lie_on_the_stages_that_hold_them(layers, pp, v, emb, dense,
                                                               expected):  # fmt: skip
    par = ParallelSpec(pp=pp, pp_interleave=v, pp_split_embedding=emb)
    assert [d for _, d in _split(par, layers, dense)] == expected


def test_published_moe_pipeline_layouts_are_accepted_and_costed():
    """Refused before: dense_layers 3 > 61 // 32 for DeepSeek-V3 under pp 16 x 2."""
    model = get_model("deepseek-v3")
    train = TrainSpec(batch=1024, seq=4096, grad_accum=16, recompute="full")
    par = ParallelSpec(framework="megatron", dp=64, pp=16, pp_interleave=2, ep=64)
    check(model, train, par)
    est = estimate(model, train, par, H100)
    assert est["memory_bytes_per_device.peak"] > 0 and est["time_s.step"] > 0
    qwen = get_model("qwen3-30b-a3b", n_layers=46)  # 46 + 2 slots over pp 8 x 3 = 48
    split = ParallelSpec(framework="megatron", dp=8, pp=8, pp_interleave=3, ep=8,
                         pp_split_embedding=True, pp_split_loss=True)  # fmt: skip
    check(qwen, TrainSpec(batch=512, seq=4096, grad_accum=64), split)
    plain = split.replace(pp_split_embedding=False, pp_split_loss=False)
    a = estimate(qwen, TrainSpec(batch=512, seq=4096, grad_accum=64), split, H100)
    b = estimate(qwen, TrainSpec(batch=512, seq=4096, grad_accum=64), plain, H100)
    # the first rank holds one block less beside the embedding: less memory there
    assert a["memory_bytes_per_device.peak"] <= b["memory_bytes_per_device.peak"]
    assert a["params.total"] == b["params.total"]


def test_the_embedding_and_the_loss_may_each_fill_a_virtual_stage():
    """Issue 57, item 3: Qwen3-235B's 94 blocks with the embedding and the loss as slots,
    96 over pp 32 x vpp 3 (the Megatron-MoE-ModelZoo's layout): one slot a virtual stage,
    the first and the last holding the embedding and the loss alone. Without the slots,
    96 virtual stages for 94 blocks are refused, naming what a stage must hold."""
    model = get_model("qwen3-30b-a3b", n_layers=94)
    train = TrainSpec(batch=2048, seq=4096, grad_accum=512)
    slots = {"pp_split_embedding": True, "pp_split_loss": True}
    par = ParallelSpec(framework="megatron", dp=4, tp=2, sequence_parallel=True, pp=32,
                       pp_interleave=3, ep=8, etp=1, **slots)  # fmt: skip
    check(model, train, par)
    assert estimate(model, train, par, H100)["time_s.step"] > 0
    plain = par.replace(pp_split_embedding=False, pp_split_loss=False)
    with pytest.raises(SpecError, match=re.escape("pp * pp_interleave must be <= n_layers (a")):
        check(model, train, plain)
    with pytest.raises(SpecError, match="n_layers \\+ the embedding and loss slots"):
        check(model, train, par.replace(pp_interleave=4))


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"pp": 8, "pp_interleave": 4, "pp_split_embedding": True}, "pp",
         "n_layers + those slots must divide over pp * pp_interleave (got slots=95"),
        ({"pp_split_loss": True}, "pp_split_loss", "pp_split_loss needs pp > 1"),
        ({"pp": 16, "pp_interleave": 4}, "pp", "dense leading blocks must lie within the first"),
    ],
)  # fmt: skip
def test_a_split_megatron_refuses_names_the_field_and_its_rule(changes, field, message):
    model = get_model("deepseek-v3", n_layers=94, dense_layers=40)
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        check(model, TrainSpec(batch=64, seq=4096, grad_accum=64), ParallelSpec(**changes))
    assert err.value.field == field


@pytest.mark.parametrize("emb", [False, True])
@pytest.mark.parametrize("loss", [False, True])
@pytest.mark.parametrize(("layers", "pp", "v"), [(94, 8, 4), (61, 16, 2), (30, 4, 1), (29, 3, 2)])
def test_the_rule_and_the_cost_split_the_pipeline_alike(layers, pp, v, emb, loss):
    """The layout rule (numpy, ``specs.pipeline.first_round_layers``) and the cost model
    (sympy, ``parallel.pipeline.leading_layers``) state the same split: the blocks of the
    first pp virtual stages are the leading blocks the ranks hold."""
    par = ParallelSpec(pp=pp, pp_interleave=v, pp_split_embedding=emb, pp_split_loss=loss)
    model = get_model("llama3-8b", n_layers=layers)
    assert int(first_round_layers(par, model)) == sum(d for _, d in _split(par, layers, layers))
