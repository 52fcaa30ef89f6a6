"""Speculative decoding in ``serve`` (issue 40, item 2): the tokens a draft-and-verify cycle
yields (Leviathan et al. 2023, Eq. 1), a cycle's time from the same decode step as plain
decoding, the drafter's bytes exactly, and bad input refused naming the field."""

from __future__ import annotations

import json
import math

import pytest

from costmodel import get_hardware, get_model
from costmodel.cli import main
from costmodel.engine.quantities import flat
from costmodel.serving.estimate import decode_step, serve
from costmodel.serving.speculative import tokens_per_cycle
from costmodel.specs.checks import SpecError
from costmodel.specs.serving import ServeSpec

H100 = get_hardware("h100-sxm")


def test_tokens_per_cycle_is_leviathans_geometric_sum():
    assert tokens_per_cycle(1, 0.85) == pytest.approx(1.85)
    assert tokens_per_cycle(3, 0.7) == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert tokens_per_cycle(4, 1.0) == 5
    assert tokens_per_cycle(1000, 0.5) == pytest.approx(2.0)  # 1 / (1 - alpha)


def test_a_cycle_is_drafts_then_one_verify_over_the_tokens_it_yields():
    model = get_model("llama3-8b")
    spec = ServeSpec(input=1000, output=1000, batch=32, draft_tokens=3, acceptance=0.7)
    v = serve(model, spec, H100).values
    cycle = 3 * v["time_s.speculative.draft_step"] + v["time_s.speculative.verify_step"]
    assert v["time_s.speculative.cycle"] == pytest.approx(cycle, rel=1e-12)
    assert v["time_s.tpot"] == pytest.approx(cycle / tokens_per_cycle(3, 0.7), rel=1e-12)
    plain = serve(model, ServeSpec(input=1000, output=1000, batch=32), H100).values
    assert v["time_s.decode_step.total"] == plain["time_s.decode_step.total"]
    # the verify step is a decode step of 4 tokens a sequence: 4x the matmul FLOPs...
    verify = decode_step(model, spec, H100, per_seq=4)
    assert verify["flops"] == pytest.approx(4 * plain["flops_per_device.decode_step"], rel=1e-9)
    # ...but the same bytes (weights and cache read once): memory-bound, about as long
    assert verify["bytes"] == plain["bytes_per_device.decode_step"]
    assert v["time_s.speculative.verify_step"] == verify["phase"]["total"]
    assert 1.0 <= verify["phase"]["total"] / plain["time_s.decode_step.total"] < 1.05
    assert v["time_s.tpot"] < 0.55 * plain["time_s.tpot"]  # 2.5 tokens a cycle
    assert v["time_s.e2e"] == pytest.approx(v["time_s.ttft"] + 999 * v["time_s.tpot"])


def test_the_drafters_bytes_are_one_layer_its_matrix_and_its_cache():
    """Llama-3-8B's drafter: one layer (q and o 4096^2, k and v 4096 x 1024, the SwiGLU's
    3 x 4096 x 14336), the 2 x 4096^2 matrix, in bf16; per sequence its own layer's cache
    (2 x 8 x 128 elements a token, bf16) of the context in blocks of 16, and 3 slots more
    of the model's 32 layers (131,072 B a token) once they cross a block."""
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    weights = (layer + 2 * 4096**2) * 2
    for context, blocks in ((1990, 0), (2000, 1)):  # 1,993 tokens fill 125 blocks; 2,003 not
        spec = ServeSpec(input=context - 100, output=100, batch=5, draft_tokens=3,
                         acceptance=0.8)  # fmt: skip
        v = serve(get_model("llama3-8b"), spec, H100).values
        own = 2 * 8 * 128 * 2 * math.ceil(context / 16) * 16
        assert v["memory_bytes_per_device.drafter"] == weights + 5 * (own + blocks * 16 * 131072)
        plain = serve(get_model("llama3-8b"), ServeSpec(input=context - 100, output=100,
                                                        batch=5), H100).values  # fmt: skip
        assert v["memory_bytes_per_device.total"] == pytest.approx(
            plain["memory_bytes_per_device.total"] + v["memory_bytes_per_device.drafter"]
        )
        assert v["max_batch"] < plain["max_batch"]


def test_a_moe_verify_step_reads_the_experts_its_tokens_reach():
    model = get_model("qwen3-30b-a3b")
    spec = ServeSpec(input=1000, output=200, batch=4, draft_tokens=2, acceptance=0.8)
    one, three = (decode_step(model, spec, H100, per_seq=n) for n in (1, 3))
    assert three["expert_bytes"] > one["expert_bytes"]  # 12 tokens reach more of 128 experts
    assert three["bytes"] - one["bytes"] == pytest.approx(
        three["expert_bytes"] - one["expert_bytes"]
    )


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--draft-tokens", "3"], "acceptance"),
        (["--acceptance", "0.8"], "acceptance"),
        (["--draft-tokens", "3", "--acceptance", "1.2"], "acceptance"),
        (["--draft-tokens", "3", "--acceptance", "0"], "acceptance"),
        (["--draft-tokens", "-1", "--acceptance", "0.8"], "draft_tokens"),
        (["--draft-tokens", "2", "--acceptance", "0.8", "--draft-layers", "0"], "draft_layers"),
    ],
)
def test_bad_speculative_input_is_one_line_naming_the_field(flags, field, refused):
    base = ["serve", "--model", "llama3-8b", "--context", "2048", "--json"]
    said = refused([*base, *flags])
    assert "--" + field.replace("_", "-") in said or f"needs {field}" in said


def test_the_cli_reports_the_cycle(capsys):
    argv = ["serve", "--model", "llama3-8b", "--context", "2048", "--batch", "8",
            "--draft-tokens", "2", "--acceptance", "0.8", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = flat(json.loads(capsys.readouterr().out))
    assert out["speculative.tokens_per_cycle"] == pytest.approx(1 + 0.8 + 0.64)
    assert out["time_s.tpot"] < out["time_s.decode_step.total"]
    with pytest.raises(SpecError, match="acceptance"):
        ServeSpec(input=10, output=10, draft_tokens=1)


def test_the_memory_lines_add_up_with_a_drafter(capsys):
    """A probe: the drafter's weights and caches were in the total but not in the lines."""
    assert main(["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "1000",
                 "--output", "500", "--batch", "16", "--draft-tokens", "4",
                 "--acceptance", "0.9", "--json"]) == 0  # fmt: skip
    data, mem = flat(json.loads(capsys.readouterr().out)), "memory_bytes_per_device."
    parts = ("weights", "kv_cache_paged", "workspace", "drafter")
    assert sum(data[mem + k] for k in parts) == pytest.approx(data[mem + "total"])
    assert main(["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "1000",
                 "--output", "500", "--batch", "16", "--draft-tokens", "4",
                 "--acceptance", "0.9"]) == 0  # fmt: skip
    assert "drafter                574.00 MiB" in capsys.readouterr().out
