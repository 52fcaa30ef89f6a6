"""The dense FFN: every token through one MLP of hidden width F (or an expert's F_e).

Variants by activation (``ModelSpec.ffn``): SwiGLU, ``W2(silu(W1 x) * W3 x)`` with gate,
up and down projections (Shazeer 2020, "GLU Variants Improve Transformer"); GELU and ReLU,
``W2 act(W1 x)`` (Vaswani et al. 2017; Hendrycks & Gimpel 2016). What each keeps, moves
and dispatches is the reference model's (``validate/reference/model.py``), op by op. The
MoE kind (``costmodel.kinds.ffn.moe``) builds its experts from these functions. Units:
parameters, FLOPs, bytes per token, kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costmodel.kinds.ops import differ
from costmodel.specs.model import ModelSpec
from costmodel.symbols.core import D, F, Y
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


@dataclass(frozen=True)
class Activation:
    """One activation's FFN: its matrices and, per hidden unit, what the reference model
    keeps between the matmuls, moves in eager elementwise ops and dispatches."""

    matrices: int
    """Weight matrices: SwiGLU's gate, up and down; GELU's and ReLU's up and down."""
    kept: tuple[int, int]
    """Bytes kept per hidden unit as (compute-dtype tensors, matmul inputs): SwiGLU the
    gate's pre-activation, silu(gate) and up, and the product into W2; GELU the
    pre-activation and its output into W2; ReLU its output, which is also W2's input."""
    moved: tuple[int, int]
    """Eager bytes per hidden unit over the compute dtype's size (forward, backward):
    SwiGLU silu (2) and the product (3), backward silu's (3) and the product's two
    gradients (6); GELU and ReLU the activation (2) and its backward (3)."""
    kernels: tuple[int, int]
    """Elementwise kernels (forward, backward): SwiGLU silu and the product, backward
    silu's, the product's two gradients and their sum into the shared input; one each."""


ACTIVATIONS: dict[str, Activation] = {
    "swiglu": Activation(3, (3, 1), (5, 9), (2, 4)),
    "gelu": Activation(2, (1, 1), (2, 3), (1, 1)),
    "relu": Activation(2, (1, 0), (2, 3), (1, 1)),
}
"""``ModelSpec.ffn`` -> its activation's table."""


def activation(model: ModelSpec) -> Activation:
    """The model's FFN activation."""
    return ACTIVATIONS[model.ffn]


def matrices(model: ModelSpec) -> int:
    """Weight matrices of one FFN: 3 (SwiGLU) or 2."""
    return activation(model).matrices


def linear(fan_in: sp.Expr, fan_out: sp.Expr, bias: bool) -> sp.Expr:
    """Parameters of a linear layer: m·n weights and, with a bias, n more."""
    return fan_in * fan_out + (fan_out if bias else 0)


def params(model: ModelSpec, width: sp.Expr) -> sp.Expr:
    """One FFN of hidden width ``width``: its up (and gate) and down projections."""
    return (matrices(model) - 1) * linear(D, width, model.bias) + linear(width, D, model.bias)


def hidden_kept(model: ModelSpec, act: int, mm: int, width: sp.Expr) -> sp.Expr:
    """Bytes per token an FFN of hidden width ``width`` keeps between its matmuls."""
    compute, matmul = activation(model).kept
    return (compute * act + matmul * mm) * width


def hidden_moved(model: ModelSpec, a: int, width: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) eager bytes per token of the activation over ``width``."""
    fwd, bwd = activation(model).moved
    return fwd * a * width, bwd * a * width


def kernels(model: ModelSpec, param: int, compute: int) -> tuple[int, int]:
    """(forward, backward) kernels of one FFN: its matmuls (backward: input and weight
    gradients, bias sums), their weights' casts (``param`` to ``compute`` bytes), the
    activation, and the sum of the gradients of the input SwiGLU's gate and up share."""
    mats = matrices(model)
    biased = mats if model.bias else 0
    casts = (mats + biased) * differ(param, compute)
    act = activation(model).kernels
    return mats + casts + act[0], 2 * mats + biased + casts + act[1]


class Dense:
    """A dense FFN block: one MLP of width F for every token (per block, per token)."""

    name = "dense"
    ops = ("ffn",)
    kept_parts = ("ffn_hidden",)
    routes = False
    field = None
    """The ModelSpec field that selects this kind (none: the default)."""
    title = "dense FFNs"
    offload = True
    """Whether offload plans are modelled for its blocks."""
    grouped_ops: tuple[str, ...] = ()
    """None of its matmuls run as grouped GEMMs."""

    def params(self, model: ModelSpec) -> dict[str, sp.Expr]:
        return {"ffn": params(model, F)}

    def unused(self, model: ModelSpec) -> sp.Expr:
        """Parameters a token does not run through: none."""
        return integer(0)

    def routed(self, model: ModelSpec) -> tuple[sp.Expr, sp.Expr]:
        """(parameters, matmul weights) expert parallelism splits: none."""
        return integer(0), integer(0)

    def matmul_weights(self, model: ModelSpec) -> sp.Expr:
        return matrices(model) * D * F

    def weight_matrices(self, model: ModelSpec) -> list[tuple[sp.Expr, sp.Expr]]:
        return [(integer(matrices(model) - 1), D * F), (integer(1), F * D)]

    def forward_flops(self, model: ModelSpec) -> dict[str, sp.Expr]:
        return {"ffn": matrices(model) * 2 * D * F}

    def hidden_width(self, model: ModelSpec) -> sp.Expr:
        return F

    def kept(self, model: ModelSpec, act: int, mm: int) -> dict[str, sp.Expr]:
        return {"ffn_hidden": hidden_kept(model, act, mm, F)}

    def kept_scales(
        self, model: ModelSpec, act: int, mm: int, weighted: bool = True
    ) -> dict[str, sp.Expr]:
        """Every rank keeps its own tokens' FFN: no multiplier."""
        return {}

    def moved(self, model: ModelSpec, a: int) -> tuple[sp.Expr, sp.Expr]:
        return hidden_moved(model, a, F)

    def bias_outputs(self, model: ModelSpec) -> sp.Expr:
        """Output features whose biases backward sums: the up (and gate) and down's."""
        return D + (matrices(model) - 1) * F

    def input_consumers(self, model: ModelSpec) -> int:
        """Matmuls beyond the first that read the block's FFN input (SwiGLU's up)."""
        return matrices(model) - 2

    def eager_kernels(self, model: ModelSpec, prec: Any) -> tuple[Any, Any]:
        return kernels(model, prec.param, prec.activation)

    def fused_kernels(self, model: ModelSpec) -> tuple[Any, Any]:
        """Kernels beyond the block's matmuls and fused regions: none."""
        return 0, 0

    def graphed_kernels(self, model: ModelSpec) -> tuple[Any, Any, int]:
        """None: Megatron-Core's partial graphs capture a dense MLP only in the ``mlp``
        scope, which the recipes costed here do not use."""
        return 0, 0, 0

    def gemms(self, model: ModelSpec) -> dict[str, list[tuple[sp.Expr, ...]]]:
        """Per device under tensor parallelism Y: column-parallel up (and gate), the
        row-parallel down projection (Shoeybi et al. 2019, Sec. 3)."""
        one = integer(1)
        up = [(one, D, F / Y, one)] * (matrices(model) - 1)
        return {"ffn": [*up, (one, F / Y, D, one)]}


DENSE = Dense()
