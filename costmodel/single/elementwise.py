"""Bytes moved by the elementwise work of one block in eager PyTorch, per token.

Eager mode runs every elementwise op as its own kernel, which reads each input tensor and
writes its output from and to HBM; ``torch.compile`` (or hand-fused kernels such as
Megatron's and Transformer Engine's) merges chains of them into one pass. The counts below
are those of the reference model (``validate/reference``: composite RMSNorm/LayerNorm in
fp32 statistics, rotate-half RoPE, SwiGLU/GELU/ReLU FFN, residual adds, and what autograd
runs for each in backward), op by op as torch dispatches them; ``validate.probes.traffic``
counts the same at full scale on the ``meta`` device. Not counted: matmuls and the
attention core (their own roofline), views, the weights' casts and the loss (timed
elsewhere), and reads of D-sized weights and position tables shared by all tokens (a
1/T share). Units: bytes per token per layer, with ``a`` compute bytes, ``r`` the residual
stream's, statistics in fp32.
"""

from __future__ import annotations

import sympy as sp

from costmodel.single.params import ffn_matrices
from costmodel.specs.model import ModelSpec
from costmodel.symbols import D, E_r, E_s, F, F_e, H, K, at_least_one, d_h, k_r, more_than_one

STAT = 4  # norm statistics are fp32


def _cast(src: int, dst: int, n: sp.Expr) -> sp.Expr:
    """``.to(dtype)`` reads and writes n elements, or dispatches nothing if the dtype holds."""
    return (src + dst) * n if src != dst else sp.Integer(0)


def _norm(
    model: ModelSpec, r: int, a: int, width: sp.Expr = D, rows: sp.Expr = 1
) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) of one norm over ``rows`` vectors of ``width`` per token (the
    block's: one of D; ``qk_norm``'s: a head's d_h, H or K of them), its output cast to
    the compute dtype included.

    RMSNorm forward: pow, mean, +eps, rsqrt, x·rstd, ·w (8D+4D+8+8+8D+8D = 28D + 24 over
    fp32 D-vectors, plus the casts in and out); backward: x̂, g·w, (g·w)·x̂, mean, x̂·mean,
    subtract, ·rstd, g·x̂ and its sum for dw (76D). LayerNorm adds the mean subtraction
    (computed twice in forward and once in backward), the bias and the extra mean.
    """
    casts = 2 * _cast(r, STAT, width)  # x to fp32 and the result back, in both passes
    to_compute = _cast(r, a, width)  # the block feeds the matmuls in the compute dtype
    if model.norm == "rmsnorm":
        fwd, bwd = 28 * width + 24, 76 * width + 16
    else:
        fwd, bwd = 56 * width + 36, 100 * width + 28
    fwd += casts + to_compute
    return rows * fwd, rows * (bwd + casts + _cast(r, STAT, width) + to_compute)


def _rope(a: int) -> tuple[sp.Expr, sp.Expr]:
    """Rotate-half RoPE on Q and K: x·cos, neg of one half, cat, ·sin, add (10a per
    element); backward: two products, neg, cat of the halves' gradients, add (10a). Each
    product also reads a row of the cos or sin table (a·d_h)."""
    n = (H + K) * d_h
    return 10 * a * n + 4 * a * d_h, 10 * a * n + 4 * a * d_h


def _ffn(model: ModelSpec, a: int) -> tuple[sp.Expr, sp.Expr]:
    """SwiGLU: silu (2aF) and the product (3aF); backward: silu's (3aF) and the product's
    two gradients (6aF). GELU and ReLU: the activation (2aF) and its backward (3aF)."""
    if model.ffn == "swiglu":
        return 5 * a * F, 9 * a * F
    return 2 * a * F, 3 * a * F


def _bias(model: ModelSpec, a: int, moe: bool = False) -> tuple[sp.Expr, sp.Expr]:
    """A biased projection adds its bias in forward only where ``addmm`` cannot (never
    here) and sums its output gradient over tokens in backward (a per output; an MoE
    FFN's experts over the tokens routed to them; Q, K and V alone under ``qkv_bias``)."""
    if not (model.bias or model.qkv_bias):
        return sp.Integer(0), sp.Integer(0)
    outputs = sp.Integer(0) if model.ffn_only else (H + 2 * K) * d_h  # Q, K and V's
    if model.bias:  # O's and the FFN's
        up = ffn_matrices(model) - 1
        outputs += D + up * F
        if moe:
            shared = at_least_one(E_s) * (D + up * E_s * F_e)
            outputs += k_r * (D + up * F_e) + shared - (D + up * F)
        if not model.ffn_only:
            outputs += D
    return sp.Integer(0), a * outputs


def _moe(model: ModelSpec, a: int) -> tuple[sp.Expr, sp.Expr]:
    """An MoE FFN as the reference model runs it (``validate/reference/moe.py``), per token.

    Router: the logits' fp32 cast, softmax (8E), top-k (reads 4E, writes k values and int64
    indices), the renormalisation's sum and division (where it renormalises), the weights'
    cast; backward the
    softmax's (12E), top-k's scatter into zeros, the division's five ops and sum, and the
    add of the two paths. Every expert reads whole per-token tensors each step: its mask
    compares all the indices (9k), nonzero reads the mask (k), the gathers read all the
    inputs (aD) and weights (ak), the out-of-place index_add reads and writes all the
    outputs (2aD); backward the same for the gathers' scatters into zeros and the
    index_add's gather. Per routed pair: the gathered rows and their int64 indices, the
    expert's activation (as a dense FFN's), the weighting product and its gradients (the
    weight's a product and a sum over D). The gradients of the input add up over the
    E experts, the router and the shared FFN; the weights' over the experts.
    """
    c = _cast(a, STAT, sp.Integer(1))  # a + 4 where the compute dtype is not fp32
    act_f, act_b = _ffn(model, a)
    swiglu = 3 * a * D if model.ffn == "swiglu" else 0  # gate and up share their input
    shared = at_least_one(E_s)
    renorm = int(model.moe_renormalize)
    fwd = c * E_r + 8 * E_r + 4 * E_r + 12 * k_r + (4 * k_r + 4 + 8 * k_r + 4) * renorm + c * k_r
    fwd += E_r * (9 * k_r + k_r + a * D + a * k_r + 2 * a * D)
    pair = 16 + (8 + a * D) + (16 + a) + (2 * a * D + a) + (8 + a * D)
    fwd += k_r * (pair + act_f.subs(F, F_e)) + shared * act_f.subs(F, E_s * F_e)
    div = 48 * k_r + 16 - (4 * k_r + 4) * (1 - more_than_one(k_r))  # k = 1: no sum
    bwd = c * E_r + 12 * E_r + 8 * E_r + 12 * k_r + (div + 12 * k_r) * renorm + c * k_r
    bwd += E_r * (a * D + 2 * a * D + 2 * a * k_r) + (E_r + shared) * 3 * a * D
    bwd += (E_r - 1) * 3 * a * k_r
    pair = (8 + a * D) + (2 * a * D + a) + 3 * a * D + (a * D + a) + (8 + a * D) + (16 + a)
    bwd += k_r * (pair + act_b.subs(F, F_e) + swiglu)
    bwd += shared * (act_b.subs(F, E_s * F_e) + swiglu)
    if model.shared_expert_gate:  # sigmoid and the product (the gate's (n, 1) operand per
        # token); backward the product's two gradients, the gate's sum over D, sigmoid's,
        # and the add of the input's gradient from the gate's matmul
        fwd += 2 * a + 2 * a * D + a
        bwd += (2 * a * D + a) + 3 * a * D + (a * D + a) + 3 * a + 3 * a * D
    return fwd, bwd


def eager_bytes(
    model: ModelSpec, r: int, a: int, dropout: bool = False, *, moe: bool = False
) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes per token per layer of the elementwise ops in eager mode.

    Residual adds read the stream (r) and the branch (a) and write the stream (2r + a per
    element, two per block, one FFN-only); backward adds the gradients of the stream's two
    paths (3r), of the matmuls sharing an input (3a per extra consumer: K and V beside Q,
    the up projection beside SwiGLU's gate), and casts the branch's gradient (r + a).
    ``dropout`` on each branch's output moves 2a + 1 bytes per element in each pass.
    """
    if model.mla:  # refused by the spec layer (``moe_train_rule``): never a silent number
        raise ValueError("eager elementwise bytes are not modelled for MLA")
    blocks = 1 if model.ffn_only else 2
    fwd = blocks * (2 * r + a) * D
    bwd = blocks * (3 * r * D + _cast(r, a, D))
    if dropout:  # native_dropout: read, write, bool mask; its backward reads both back
        fwd += blocks * (2 * a + 1) * D
        bwd += blocks * (2 * a + 1) * D
    consumers = (0 if moe else ffn_matrices(model) - 2) + (0 if model.ffn_only else 2)
    bwd += consumers * 3 * a * D
    parts = [_moe(model, a) if moe else _ffn(model, a), _bias(model, a, moe)]
    if model.ffn_only:
        parts.append((_cast(r, a, D), _cast(r, a, D)))
    else:
        parts += [_norm(model, r, a), _norm(model, r, a)]
        if model.qk_norm:  # over each head's query and key, in the compute dtype
            parts += [_norm(model, a, a, d_h, H), _norm(model, a, a, d_h, K)]
        if model.pos == "rope":
            parts.append(_rope(a))
    fwd += sum((p[0] for p in parts), sp.Integer(0))
    bwd += sum((p[1] for p in parts), sp.Integer(0))
    return sp.expand(fwd), sp.expand(bwd)
