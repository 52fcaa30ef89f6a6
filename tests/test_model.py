"""The reference model on real tensors: numerics, gradients, and exact counts on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from costmodel import ModelSpec, TrainSpec, get_model
from validate.probes.accounting import compare
from validate.reference.model import TransformerLM, make_batch
from validate.reference.norms import LayerNorm, RMSNorm

TINY = ModelSpec(vocab=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)


@pytest.mark.parametrize("norm_cls", [RMSNorm, LayerNorm])
def test_norms_match_torch_and_pass_gradcheck(norm_cls):
    torch.manual_seed(0)
    norm = norm_cls(8).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    if norm_cls is RMSNorm:
        ref = F.rms_norm(x, (8,), norm.weight, norm.eps)
    else:
        ref = F.layer_norm(x, (8,), norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(norm(x), ref)
    assert torch.autograd.gradcheck(norm, (x,))


def test_flash_and_naive_give_the_same_loss_and_gradients():
    torch.manual_seed(0)
    naive = TransformerLM(TINY, attention="naive")
    flash = TransformerLM(TINY, attention="flash")
    flash.load_state_dict(naive.state_dict())
    batch = make_batch(naive, 2, 11, generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (naive, flash):
        loss = model(batch)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(naive.named_parameters(), flash.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("recompute", ["full", "selective", "selective-op"])
def test_recomputation_does_not_change_gradients(recompute):
    torch.manual_seed(0)
    ref = TransformerLM(TINY, attention="naive")
    ckpt = TransformerLM(TINY, attention="naive", recompute=recompute)
    ckpt.load_state_dict(ref.state_dict())
    batch = make_batch(ref, 2, 9, generator=torch.Generator().manual_seed(2))
    ref(batch).backward()
    ckpt(batch).backward()
    for a, b in zip(ref.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_bf16_mixed_is_close_to_fp32():
    # bf16 has 8 mantissa bits: relative error ~2^-8 per op; 2 layers stay within 2e-2.
    torch.manual_seed(0)
    ref = TransformerLM(TINY)
    mixed = TransformerLM(TINY, precision="bf16-mixed")
    mixed.load_state_dict(ref.state_dict())
    batch = make_batch(ref, 2, 16, generator=torch.Generator().manual_seed(3))
    assert next(mixed.parameters()).dtype == torch.float32
    torch.testing.assert_close(mixed(batch), ref(batch), rtol=2e-2, atol=0)


def test_fp8_is_refused_by_the_reference_model():
    with pytest.raises(ValueError, match="fp8 is modelled by costmodel but not run"):
        TransformerLM(TINY, precision="fp8")


@pytest.mark.parametrize("name", ["cs336-small", "gpt2", "llama3-8b", "xxl"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_exact_on_real_cpu_tensors(name, precision, attention):
    # Same counts as on meta, with real storages and the real CPU kernels.
    model = get_model(
        name,
        n_layers=1,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        **({} if name == "xxl" else {"vocab": 101}),
    )
    train = TrainSpec(batch=2, seq=24, precision=precision, attention=attention)
    wrong = [r for r in compare(model, train, device="cpu") if r["predicted"] != r["measured"]]
    assert not wrong, wrong


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_exact_on_cuda_naive(precision):
    model = get_model("cs336-small", n_layers=2)
    train = TrainSpec(batch=2, seq=128, precision=precision, attention="naive")
    wrong = [r for r in compare(model, train, device="cuda") if r["predicted"] != r["measured"]]
    assert not wrong, wrong


@pytest.mark.parametrize("recompute", ["full", "selective", "selective-op"])
def test_recomputation_with_dropout_redraws_the_same_masks(recompute):
    """Checkpointed regions restore the RNG state, so recomputed dropout masks equal the
    forward's and gradients equal the plain model's under the same seed."""
    torch.manual_seed(0)
    ref = TransformerLM(TINY, attention="naive", dropout=0.1)
    ckpt = TransformerLM(TINY, attention="naive", recompute=recompute, dropout=0.1)
    ckpt.load_state_dict(ref.state_dict())
    batch = make_batch(ref, 2, 9, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    ref(batch).backward()
    torch.manual_seed(5)
    ckpt(batch).backward()
    for a, b in zip(ref.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
