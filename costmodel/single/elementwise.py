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

from typing import TYPE_CHECKING

from costmodel.kinds import attention, ffn
from costmodel.kinds.ops import STAT
from costmodel.kinds.ops import cast_bytes as _cast
from costmodel.specs.model import ModelSpec
from costmodel.symbols.core import D, H, K, d_h
from costmodel.symbols.ops import expand, integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


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


def _bias(model: ModelSpec, a: int, kind: ffn.FFNKind) -> tuple[sp.Expr, sp.Expr]:
    """A biased projection adds its bias in forward only where ``addmm`` cannot (never
    here) and sums its output gradient over tokens in backward (a per output; an MoE
    FFN's experts over the tokens routed to them; Q, K and V alone under ``qkv_bias``)."""
    if not (model.bias or model.qkv_bias):
        return integer(0), integer(0)
    outputs = integer(0) if model.ffn_only else (H + 2 * K) * d_h  # Q, K and V's
    if model.bias:  # O's and the FFN's
        outputs += kind.bias_outputs(model)
        if not model.ffn_only:
            outputs += D
    return integer(0), a * outputs


def eager_bytes(
    model: ModelSpec, r: int, a: int, dropout: bool = False, *, block: str = "dense"
) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes per token per layer of the elementwise ops in eager mode,
    in a block whose FFN is of the kind named ``block`` (``costmodel.kinds.ffn``).

    Residual adds read the stream (r) and the branch (a) and write the stream (2r + a per
    element, two per block, one FFN-only); backward adds the gradients of the stream's two
    paths (3r), of the matmuls sharing an input (3a per extra consumer: K and V beside Q,
    the up projection beside SwiGLU's gate), and casts the branch's gradient (r + a).
    ``dropout`` on each branch's output moves 2a + 1 bytes per element in each pass.
    """
    projections = attention.projections(model)
    if not projections.eager:  # refused by the spec layer: never a silent number
        raise ValueError(f"eager elementwise bytes are not modelled for {projections.title}")
    blocks = 1 if model.ffn_only else 2
    fwd = blocks * (2 * r + a) * D
    bwd = blocks * (3 * r * D + _cast(r, a, D))
    if dropout:  # native_dropout: read, write, bool mask; its backward reads both back
        fwd += blocks * (2 * a + 1) * D
        bwd += blocks * (2 * a + 1) * D
    kind = ffn.KINDS[block]
    consumers = kind.input_consumers(model) + (0 if model.ffn_only else 2)
    bwd += consumers * 3 * a * D
    parts = [kind.moved(model, a), _bias(model, a, kind)]
    if model.ffn_only:
        parts.append((_cast(r, a, D), _cast(r, a, D)))
    else:
        parts += [_norm(model, r, a), _norm(model, r, a)]
        if model.qk_norm:  # over each head's query and key, in the compute dtype
            parts += [_norm(model, a, a, d_h, H), _norm(model, a, a, d_h, K)]
        if model.pos == "rope":
            parts.append(_rope(a))
    fwd += sum((p[0] for p in parts), integer(0))
    bwd += sum((p[1] for p in parts), integer(0))
    return expand(fwd), expand(bwd)
