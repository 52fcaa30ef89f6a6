"""Kinds are plug-ins: each FFN kind (dense, MoE) and attention projection kind (standard,
MLA) answers the whole protocol, consistently with itself, and a model's mix of them adds
up to the model's totals (issue 34, item 2)."""

from __future__ import annotations

import inspect

import pytest
import sympy as sp

from costmodel import get_model
from costmodel.kinds import attention, ffn
from costmodel.kinds.attention.projections import Projections
from costmodel.kinds.ffn.dense import ACTIVATIONS
from costmodel.kinds.ffn.registry import FFNKind
from costmodel.single.params import active_params, param_breakdown
from costmodel.specs.model import FFN_KINDS
from costmodel.symbols import L, L_d, values_for
from costmodel.symbols.algebra import by_symbol

MODELS = (
    "llama3-8b",
    "gpt2",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "qwen1.5-moe-a2.7b",
    "gpt-oss-20b",
)


def _members(protocol: type) -> set[str]:
    return {n for n in dir(protocol) if not n.startswith("_")} | set(
        inspect.get_annotations(protocol)
    )


@pytest.mark.parametrize("kind", list(ffn.KINDS.values()), ids=lambda k: k.name)
def test_every_ffn_kind_answers_the_whole_protocol(kind):
    assert _members(FFNKind) <= set(dir(kind))


@pytest.mark.parametrize("kind", list(attention.PROJECTIONS.values()), ids=lambda k: k.name)
def test_every_projection_kind_answers_the_whole_protocol(kind):
    assert _members(Projections) <= set(dir(kind))


def test_the_activation_table_is_the_specs_choice_list():
    assert tuple(ACTIVATIONS) == FFN_KINDS


@pytest.mark.parametrize("name", MODELS)
def test_a_kind_names_its_ops_and_parts_consistently(name):
    model = get_model(name)
    for kind, _ in ffn.blocks(model):
        assert set(kind.params(model)) == set(kind.ops) == set(kind.forward_flops(model))
        assert set(kind.gemms(model)) == set(kind.ops)
        assert set(kind.kept(model, 2, 2)) == set(kind.kept_parts)
        assert set(kind.kept_scales(model, 2, 2)) <= set(kind.kept_parts)
    projections = attention.projections(model)
    ops = {op for op, _, _ in projections.matrices(model)}
    assert ops == set(projections.shapes(model)) == set(projections.shapes(model, True))


@pytest.mark.parametrize("name", MODELS)
def test_the_mix_adds_up_to_the_models_parameters(name):
    """The blocks of each FFN kind, times each block's parameters, are the breakdown's FFN
    entries; an MoE model's routed experts are what ep splits and what a token skips."""
    model = get_model(name)
    values = by_symbol(values_for(model))
    parts = param_breakdown(model)
    counts = [int(n.xreplace(values)) for _, n in ffn.blocks(model)]
    assert sum(counts) == model.n_layers
    for (kind, _), n in zip(ffn.blocks(model), counts, strict=True):
        for op, per_block in kind.params(model).items():
            assert int(parts[op].xreplace(values)) == n * int(per_block.xreplace(values))
    top = ffn.top(model)
    routed = int(top.routed(model)[0].xreplace(values))
    assert routed == (int(top.params(model)["experts"].xreplace(values)) if top.routes else 0)
    skipped = int((parts["total"] - active_params(model)).xreplace(values))
    assert skipped == (model.n_layers - model.dense_layers) * int(
        top.unused(model).xreplace(values)
    )


def test_a_dense_model_is_one_kind_and_an_moe_model_two():
    assert ffn.blocks(get_model("llama3-8b")) == [(ffn.KINDS["dense"], L)]
    mix = ffn.blocks(get_model("mixtral-8x7b"))
    assert [k.name for k, _ in mix] == ["dense", "moe"] and mix[1][1] == L - L_d
    assert ffn.routes(get_model("mixtral-8x7b")) and not ffn.routes(get_model("llama3-8b"))


def test_mla_is_chosen_by_its_latent_rank():
    assert attention.projections(get_model("deepseek-v2-lite")).name == "latent"
    assert attention.projections(get_model("llama3-8b")).name == "standard"
    widths = attention.projections(get_model("deepseek-v2-lite")).head_widths
    model = get_model("deepseek-v2-lite")
    d_qk, d_v = (
        sp.sympify(w).xreplace(by_symbol(values_for(model))) for w in widths(model, "naive")
    )
    assert (d_qk, d_v) == (model.head_dim + model.rope_head_dim, model.v_head_dim)
