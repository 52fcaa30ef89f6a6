"""LoRA and QLoRA (``TrainSpec.finetune``): exact against torch's counters, against PEFT's
published counts, and the refusals.

The reference model runs both (``validate/reference/lora.py``): its parameters, FLOPs
(FlopCounterMode, by op) and the bytes alive and saved after forward equal the formulas
with zero tolerance on the ``meta`` device, as for full training (``test_accounting``);
peaks are estimates (``test_peaks``' 10 % target; measured within 1.2 % on the grid below).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from costmodel import ParallelSpec, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.single.finetune import nf4_bytes
from costmodel.specs.checks import SpecError
from validate.probes.accounting import compare, measure_peaks
from validate.reference.lora import NF4, NF4Linear
from validate.reference.model import TransformerLM, make_batch

RUNS = (("fp32", "naive", "none"), ("bf16-mixed", "flash", "full"),
        ("bf16-mixed", "naive", "selective"), ("fp32", "flash", "selective"),
        ("bf16-mixed", "flash", "none"))  # fmt: skip
"""Every precision, kernel and recomputation, each beside each other's values at least once
(the full product of 72 kinds passed too; it ran 50 s)."""
KINDS = [(f, t, *run) for f, t in itertools.product(("lora", "qlora"),
         ("all-linear", "attention", "qv")) for run in RUNS]  # fmt: skip


def exact(model, train) -> None:
    rows = compare(model, train)
    wrong = [r for r in rows if r["predicted"] != r["measured"]]
    assert not wrong, wrong
    quantities = {r["quantity"] for r in rows}
    assert {"params.adapters", "params.trainable", "flops.forward_by_op.lora"} <= quantities


@pytest.mark.parametrize(("finetune", "targets", "precision", "attention", "recompute"), KINDS)
def test_every_kind_two_layers(finetune, targets, precision, attention, recompute):
    """Llama-3-8B's shapes (GQA, SwiGLU, RoPE, untied): every kind of fine-tuning."""
    train = TrainSpec(batch=2, seq=64, finetune=finetune, lora_targets=targets, lora_rank=8,
                      precision=precision, attention=attention, recompute=recompute)  # fmt: skip
    exact(get_model("llama3-8b", n_layers=2), train)


@pytest.mark.parametrize("name", ["gpt2", "cs336-small", "mistral-7b"])
@pytest.mark.parametrize("finetune", ["lora", "qlora"])
def test_other_families_two_layers(name, finetune):
    """Biases, learned positions, tied embeddings, LayerNorm and GELU (GPT-2), and the
    rest; dropout on the residual branches keeps its masks."""
    for targets, recompute in (("qv", "none"), ("all-linear", "full")):
        train = TrainSpec(batch=3, seq=40, finetune=finetune, lora_targets=targets,
                          lora_rank=4, precision="bf16-mixed", recompute=recompute,
                          attention="naive", dropout=0.1)  # fmt: skip
        exact(get_model(name, n_layers=2), train)


def test_llama3_8b_full_depth():
    exact(get_model("llama3-8b"), TrainSpec(batch=1, seq=512, finetune="lora"))


@pytest.mark.slow
def test_llama3_8b_full_depth_qlora():
    """Its reference dequantizes 224 NF4 matrices chunk by chunk: 26 s on 2 cores."""
    exact(get_model("llama3-8b"), TrainSpec(batch=1, seq=512, finetune="qlora"))


def test_peft_trainable_counts():
    """PEFT's ``print_trainable_parameters`` for the two most quoted setups: Llama-2-7B,
    r 8 on q_proj and v_proj, 4,194,304; Llama-3-8B, r 16 on every linear, 41,943,040."""
    qv = TrainSpec(finetune="lora", lora_rank=8, lora_targets="qv")
    assert estimate(get_model("llama2-7b"), qv)["params.trainable"] == 4_194_304
    every = TrainSpec(finetune="lora", lora_rank=16)
    assert estimate(get_model("llama3-8b"), every)["params.trainable"] == 41_943_040
    assert estimate(get_model("llama3-8b"), TrainSpec())["params.trainable"] == 8_030_261_248


def test_nf4_bits_per_weight():
    """QLoRA, Sec. 3: 4 bits per weight plus 8/64 + 32/(64·256) = 0.127 bits of constants."""
    n = 4096 * 14336
    assert nf4_bytes(n) * 8 / n == pytest.approx(4 + 8 / 64 + 32 / (64 * 256), abs=1e-6)
    assert nf4_bytes(65) == 33 + 2 + 4 + 4  # a partial block pays a whole absmax


def test_nf4_round_trip():
    """Normal weights come back within NF4's resolution: each within half the widest gap
    between two levels of its block's absmax (plus 1 % for the int8 absmax), about 9 %
    of the norm in all."""
    weight = torch.randn(96, 200, generator=torch.Generator().manual_seed(0)) * 0.02
    layer = NF4Linear(weight, None, torch.float32)
    back = layer.dequantize()
    assert back.shape == weight.shape
    blocks = torch.nn.functional.pad(weight.flatten(), (0, -weight.numel() % 64)).view(-1, 64)
    worst = (back - weight).abs().flatten()
    worst = torch.nn.functional.pad(worst, (0, -worst.numel() % 64)).view(-1, 64).amax(1)
    half_gap = max(hi - lo for lo, hi in itertools.pairwise(NF4)) / 2
    assert torch.all(worst <= (half_gap + 0.01) * blocks.abs().amax(1))
    assert (back - weight).norm() / weight.norm() < 0.12


@pytest.mark.parametrize("finetune", ["lora", "qlora"])
def test_adapters_start_at_the_base_model_and_train(finetune):
    """B starts at zero, so the adapted model computes the frozen one; one SGD step moves
    the adapters only."""
    spec, train = get_model("cs336-small", n_layers=2), TrainSpec(finetune=finetune, lora_rank=4)
    torch.manual_seed(0)
    model = TransformerLM.for_training(spec, train)
    batch = make_batch(model, 2, 32, generator=torch.Generator().manual_seed(1))
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert trained and all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    loss = model(batch)
    loss.backward()
    with torch.no_grad():
        for p in trained:
            p -= 0.5 * p.grad
    assert model(batch) < loss
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


@pytest.mark.parametrize(("name", "finetune", "precision"), [
    ("llama3-8b", "lora", "bf16-mixed"), ("llama3-8b", "qlora", "bf16"),
    ("gpt2", "qlora", "fp32"), ("cs336-small", "lora", "bf16"),
])  # fmt: skip
def test_peaks(name, finetune, precision):
    train = TrainSpec(batch=2, seq=128, finetune=finetune, lora_rank=8, precision=precision)
    measured = measure_peaks(get_model(name, n_layers=2), train)
    est = estimate(get_model(name, n_layers=2), train)
    for key, value in measured.items():
        assert abs(est[f"memory_bytes.{key}"] - value) <= 0.02 * value, (key, value)


def test_memory_and_time_against_full_training():
    """Llama-3-8B on one H100: the adapters' state is r/D-small, QLoRA stores the block
    matrices in 4.127 bits, backward runs dX alone (a step of LoRA does 3/4 of full
    training's forward-backward-recompute FLOPs plus the adapters'), and DDP all-reduces the
    adapters' gradients alone."""
    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    runs = {}
    for kind in ("full", "lora", "qlora"):
        train = TrainSpec(batch=16, seq=2048, grad_accum=8, finetune=kind, recompute="full")
        runs[kind] = estimate(model, train, ParallelSpec(dp=2), hw)
    full, lora, qlora = runs["full"], runs["lora"], runs["qlora"]
    assert lora["memory_bytes_per_device.frozen"] == 2 * full["params.total"]
    assert qlora["memory_bytes_per_device.frozen"] < 0.4 * lora["memory_bytes_per_device.frozen"]
    assert lora["memory_bytes_per_device.grads"] == 4 * lora["params.trainable"]
    assert lora["comm_bytes.dp"] == full["comm_bytes.dp"] * 41_943_040 / 8_030_261_248
    for run, passes in ((full, 3), (lora, 2)):  # (dX, dW,) recompute
        assert run["flops.backward_by_op.attn_q"] == passes * run["flops.forward_by_op.attn_q"]
    # the adapters: dX, dW and the recompute, which stops before the last block matmul, the
    # down projection's B (torch.utils.checkpoint's early stop)
    down_b = 2 * 16 * 2048 * 32 * 16 * 4096
    assert lora["flops.backward_by_op.lora"] == 3 * lora["flops.forward_by_op.lora"] - down_b
    # a step: full training's, less every matmul's dW (its forward FLOPs), plus the
    # adapters' and the FFN's down projection, which the recompute now runs (its adapter's
    # B is the block's last matmul instead)
    core = ("flops.forward_by_op.attn_scores", "flops.forward_by_op.attn_values")
    weight_grads = full["flops.forward"] - sum(full[k] for k in core)
    down = 2 * 16 * 2048 * 32 * 14336 * 4096
    adapters = lora["flops.forward_by_op.lora"] + lora["flops.backward_by_op.lora"]
    assert lora["flops.step"] == full["flops.step"] - weight_grads + down + adapters
    assert lora["time_s.step"] < full["time_s.step"] < 2 * lora["time_s.step"]
    assert qlora["time_s.step"] > lora["time_s.step"]  # dequantizing every matrix per pass


@pytest.mark.parametrize(("train", "field", "words"), [
    (dict(lora_rank=2000, lora_targets="attention"), "lora_rank", "lora_rank must be <="),
    (dict(recompute="selective-op"), "recompute", "selective-op"),
    (dict(precision="fp8"), "precision", "fp8"),
])  # fmt: skip
def test_bad_fine_tuning_is_refused(train, field, words):
    with pytest.raises(SpecError, match=words) as err:
        estimate(get_model("llama3-8b"), TrainSpec(finetune="lora", **train))
    assert err.value.field == field


def test_layouts_and_models_not_modelled_are_refused():
    lora = TrainSpec(batch=8, finetune="qlora")
    hw = get_hardware("h100-sxm")
    with pytest.raises(SpecError, match="tp must be 1") as err:
        estimate(get_model("llama3-8b"), lora, ParallelSpec(tp=2), hw)
    assert err.value.field == "tp"
    with pytest.raises(SpecError, match="framework=reference"):
        estimate(get_model("llama3-8b"), lora, ParallelSpec(fsdp=2, framework="fsdp2"), hw)
    with pytest.raises(SpecError, match="mixture-of-experts") as err:
        estimate(get_model("mixtral-8x7b"), lora)
    assert err.value.field == "n_experts"
    assert estimate(get_model("llama3-8b"), TrainSpec(lora_rank=10**6))  # unused by full


def test_zero_over_frozen_and_trained_weights_by_hand():
    """ZeRO-3 over 4 ranks: each holds a quarter of the frozen weights and of the adapters'
    master, gradients and Adam moments; per micro-batch it gathers every weight as stored
    (bf16, or QLoRA's NF4) and the adapters in bf16 for forward and again for backward, and
    reduce-scatters the adapters' gradients in fp32 (the reference's, under torch.autocast):
    (n-1)/n of each. ZeRO-1 shards only the optimizer state and gathers nothing frozen."""
    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    for kind in ("lora", "qlora"):
        train = TrainSpec(batch=16, seq=1024, grad_accum=4, finetune=kind)
        one = estimate(model, train)
        zero3 = estimate(model, train, ParallelSpec(fsdp=4), hw)
        for part in ("frozen", "master", "grads", "optimizer"):
            assert zero3[f"memory_bytes_per_device.{part}"] == one[f"memory_bytes.{part}"] / 4
        frozen, adapters = one["memory_bytes.frozen"], one["params.adapters"]
        per_pass = 3 / 4 * (frozen + 2 * adapters)
        expected = 4 * (2 * per_pass + 3 / 4 * 4 * adapters)
        assert zero3["comm_bytes.fsdp"] == pytest.approx(expected, rel=1e-12)
        zero1 = estimate(model, train, ParallelSpec(fsdp=4, zero=1), hw)
        assert zero1["memory_bytes_per_device.frozen"] == frozen
        assert zero1["memory_bytes_per_device.optimizer"] == one["memory_bytes.optimizer"] / 4
        # the adapters' fp32 gradients reduce-scattered, their bf16 weights all-gathered
        assert zero1["comm_bytes.fsdp"] == pytest.approx(3 / 4 * (4 + 2) * adapters, rel=1e-12)
