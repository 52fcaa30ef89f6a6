"""LoRA adapters and QLoRA's 4-bit frozen matrices for the reference model
(``TrainSpec.finetune``; costmodel's formulas in ``costmodel/single/finetune.py``).

``LoRALinear`` wraps a frozen linear as PEFT's ``lora.Linear`` does: y = base(x) +
(α/r)·B(A(x)) with A (r x fan-in, Kaiming-uniform) and B (fan-out x r, zeros) trained in the
parameter dtype and cast to the compute dtype like every weight here (Hu et al. 2021,
Sec. 4.1; α = 2r). ``NF4Linear`` holds a matrix as QLoRA stores it: 4-bit NormalFloat codes
two to a byte in blocks of 64 weights, each block's absmax quantized again to int8 in blocks
of 256 around their fp32 mean (Dettmers et al. 2023, Sec. 3, double quantization); a matmul
dequantizes to the compute dtype and keeps nothing for backward, which dequantizes again
(bitsandbytes' ``MatMul4Bit``). The absmaxes' second level is linear int8 here where
bitsandbytes uses its dynamic 8-bit map: the same bytes, slightly different rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from costmodel.specs.finetune import LORA_TARGETS

# the 16 NF4 levels: quantiles of N(0, 1) scaled to [-1, 1] with an exact 0 (QLoRA, Sec. 3,
# Eq. 4; the values bitsandbytes ships in ``get_4bit_type("nf4")``)
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)  # fmt: skip
BLOCK, ABSMAX_BLOCK = 64, 256
CHUNK = 2**20  # weights dequantized at a time (a multiple of BLOCK)


def _blocks(flat: torch.Tensor, size: int) -> torch.Tensor:
    """``flat`` zero-padded to whole blocks of ``size``, one block per row."""
    pad = -flat.numel() % size
    return F.pad(flat, (0, pad)).view(-1, size)


class NF4Linear(nn.Module):
    """A frozen fan_in -> fan_out matrix in double-quantized NF4 (buffers; its bias, if
    any, stays a frozen parameter in the compute dtype)."""

    def __init__(self, weight: torch.Tensor, bias: nn.Parameter | None, compute) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.compute, self.bias = compute, bias
        with torch.no_grad():
            w = _blocks(weight.detach().float().flatten(), BLOCK)
            absmax = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny)
            levels = torch.tensor(NF4, device=w.device)
            codes = (w / absmax[:, None]).unsqueeze(-1).sub(levels).abs().argmin(-1)
            codes = codes.flatten()[: weight.numel() + weight.numel() % 2].to(torch.uint8)
            self.register_buffer("packed", codes[0::2] << 4 | codes[1::2])
            offset = absmax.mean()
            second = _blocks(absmax - offset, ABSMAX_BLOCK)
            scale = second.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127
            quantized = (second / scale[:, None]).round().to(torch.int8).flatten()
            self.register_buffer("absmax", quantized[: absmax.numel()])
            self.register_buffer("absmax_scale", scale)
            self.register_buffer("absmax_offset", offset)

    @property
    def numel(self) -> int:
        """Weights the matrix holds (what a parameter count counts)."""
        return self.out_features * self.in_features

    def dequantize(self) -> torch.Tensor:
        """The matrix in the compute dtype (fan_out x fan_in), written chunk by chunk so
        that little more than the result is allocated (bitsandbytes' CUDA kernel writes it
        directly)."""
        out = torch.empty(self.numel, dtype=self.compute, device=self.packed.device)
        levels = torch.tensor(NF4, device=out.device, dtype=self.compute)
        for start in range(0, self.numel, CHUNK):
            stop = min(start + CHUNK, self.numel)
            packed = self.packed[start // 2 : (stop + 1) // 2]
            codes = torch.stack((packed >> 4, packed & 15), -1).flatten()[: stop - start]
            first, last = start // BLOCK, -(-stop // BLOCK)
            index = torch.arange(first, last, device=out.device) // ABSMAX_BLOCK
            absmax = self.absmax[first:last].float() * self.absmax_scale[index]
            absmax = (absmax + self.absmax_offset).to(self.compute)
            w = _blocks(levels[codes.long()], BLOCK) * absmax[:, None]
            out[start:stop] = w.flatten()[: stop - start]
        return out.view(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _DequantMatmul.apply(x, self)


class _DequantMatmul(torch.autograd.Function):
    """x Wᵀ with W dequantized for the product and again in backward; saves nothing."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: NF4Linear) -> torch.Tensor:
        ctx.layer = layer  # its buffers, not a saved tensor: no copy kept
        return F.linear(x, layer.dequantize(), layer.bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad @ ctx.layer.dequantize(), None


class LoRALinear(nn.Module):
    """base(x) + (α/r)·B(A(x)) over a frozen ``base``; A and B are ``linear`` layers (the
    reference model's cast-to-compute linear) of the parameter dtype."""

    def __init__(self, base: nn.Module, rank: int, linear: type, compute, **factory) -> None:
        super().__init__()
        self.base, self.scale = base, 2.0
        self.lora_a = linear(base.in_features, rank, False, compute, **factory)
        self.lora_b = linear(rank, base.out_features, False, compute, **factory)
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


TARGET_MODULES = {  # costmodel's op -> the reference model's module names (block-relative)
    "attn_q": ("attn.q",), "attn_k": ("attn.k",), "attn_v": ("attn.v",),
    "attn_o": ("attn.o",), "ffn": ("ffn.w1", "ffn.w2", "ffn.w3"),
}  # fmt: skip


def apply_finetuning(model: nn.Module, train, linear: type, compute: torch.dtype) -> None:
    """Freeze ``model``'s parameters in the compute dtype, quantize its block matrices
    (QLoRA) and wrap the ``train.lora_targets`` matrices of every block with adapters of
    rank ``train.lora_rank`` in the parameter dtype the model was built with."""
    param_dtype = next(model.parameters()).dtype
    for p in model.parameters():
        p.requires_grad_(False)
        p.data = p.data.to(compute)
    targets = {name for op in LORA_TARGETS[train.lora_targets] for name in TARGET_MODULES[op]}
    for block in model.blocks:
        for name, module in list(block.named_modules()):
            if not isinstance(module, nn.Linear):
                continue
            layer: nn.Module = module
            if train.finetune == "qlora":
                layer = NF4Linear(module.weight, module.bias, compute)
            if name in targets:
                factory = {"device": module.weight.device, "dtype": param_dtype}
                layer = LoRALinear(layer, train.lora_rank, linear, compute, **factory)
            parent, _, leaf = name.rpartition(".")
            setattr(block.get_submodule(parent) if parent else block, leaf, layer)
