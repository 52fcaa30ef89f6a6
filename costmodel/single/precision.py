"""Bytes per element for each training precision, as data.

Sources: Micikevicius et al. 2018, "Mixed Precision Training" (fp32 master weights, half
activations); Rajbhandari et al. 2020, ZeRO Sec. 3.1 (2 + 2 + 12 bytes per parameter for
mixed-precision Adam); torch.autocast semantics (parameters stay fp32, matmul operands and
weights are cast to the low-precision dtype, the casts are kept for backward); NVIDIA
Transformer Engine for fp8 (fp8 GEMM operands, bf16 elsewhere, fp32 master and optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from costmodel.kinds.ops import STAT


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Storage size in bytes of each class of tensor under one precision recipe."""

    param: int
    """Stored parameters (``nn.Parameter`` dtype)."""
    weight_copy: int
    """Per-step low-precision copy of each matmul weight kept for backward (0: none)."""
    grad: int
    """Gradients, accumulated in the parameter dtype."""
    optimizer_state: int
    """One optimizer state tensor element (Adam has two per parameter)."""
    activation: int
    """Matmul outputs and everything computed in the compute dtype."""
    residual: int
    """The residual stream and norm inputs (fp32 under torch.autocast)."""
    matmul_input: int
    """Activations saved only as a matmul input (fp8 stores the quantised copy)."""
    peak_dtype: str
    """Key into a hardware table of peak FLOP/s."""
    attention_dtype: str = ""
    """The dtype attention runs in (default ``peak_dtype``): float8 recipes (torchao,
    Transformer Engine) keep attention in bf16."""

    @property
    def attention_peak_dtype(self) -> str:
        return self.attention_dtype or self.peak_dtype


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(
        param=4,
        weight_copy=0,
        grad=4,
        optimizer_state=4,
        activation=4,
        residual=4,
        matmul_input=4,
        peak_dtype="fp32",
    ),
    "tf32": Precision(
        param=4,
        weight_copy=0,
        grad=4,
        optimizer_state=4,
        activation=4,
        residual=4,
        matmul_input=4,
        peak_dtype="tf32",
    ),
    "bf16-mixed": Precision(
        param=4,
        weight_copy=2,
        grad=4,
        optimizer_state=4,
        activation=2,
        residual=4,
        matmul_input=2,
        peak_dtype="bf16",
    ),
    "fp16-mixed": Precision(
        param=4,
        weight_copy=2,
        grad=4,
        optimizer_state=4,
        activation=2,
        residual=4,
        matmul_input=2,
        peak_dtype="fp16",
    ),
    "bf16": Precision(
        param=2,
        weight_copy=0,
        grad=2,
        optimizer_state=2,
        activation=2,
        residual=2,
        matmul_input=2,
        peak_dtype="bf16",
    ),
    "fp8": Precision(
        param=4,
        weight_copy=1,
        grad=4,
        optimizer_state=4,
        activation=2,
        residual=4,
        matmul_input=1,
        peak_dtype="fp8",
        attention_dtype="bf16",
    ),
}

OPTIMIZER_STATES: dict[str, int] = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0, "none": 0}
"""State tensors per parameter (torch.optim: Adam exp_avg + exp_avg_sq; SGD momentum_buffer)."""

# Bytes an optimizer step moves, in passes over (parameters, gradients, one state tensor):
# a pass reads or writes a whole tensor once. ``fused``: one kernel reads the parameter,
# gradient and states and writes the parameter and states. ``foreach``: torch 2.x
# ``_multi_tensor_adam`` (non-capturable path) runs mul_ (decoupled weight decay: 2 param
# passes), lerp_ (m: 2 state + 1 grad), mul_ (v: 2), addcmul_ (v: 2 + 1 grad), sqrt
# (new denominator: 2), div_ (2), add_ eps (2), addcdiv_ (param 2 + m and denominator 2);
# Adam (weight_decay=0) skips the mul_. ``_multi_tensor_sgd`` with momentum: mul_ (2),
# add_ (2 + 1 grad), then the parameter update reads the buffer (1).
OPTIMIZER_PASSES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("adamw", "fused"): (2, 1, 4),
    ("adamw", "foreach"): (4, 2, 14),
    ("adam", "fused"): (2, 1, 4),
    ("adam", "foreach"): (2, 2, 14),
    ("sgd-momentum", "fused"): (2, 1, 2),
    ("sgd-momentum", "foreach"): (2, 1, 5),
    ("sgd", "fused"): (2, 1, 0),
    ("sgd", "foreach"): (2, 1, 0),
    ("none", "fused"): (0, 0, 0),
    ("none", "foreach"): (0, 0, 0),
}


def optimizer_traffic(optimizer: str, impl: str, precision: str) -> int:
    """Bytes moved per parameter by one optimizer step (parameters in their stored dtype)."""
    prec = PRECISIONS[precision]
    params, grads, states = OPTIMIZER_PASSES[(optimizer, impl)]
    return params * prec.param + grads * prec.grad + states * prec.optimizer_state


def optimizer_state_bytes(optimizer: str, precision: str, params: Any) -> Any:
    """Bytes of optimizer state for ``params`` parameters (ZeRO, Sec. 3.1: Adam keeps two
    states per parameter, momentum SGD one), in the precision's state dtype."""
    return OPTIMIZER_STATES[optimizer] * PRECISIONS[precision].optimizer_state * params


STAT_BYTES = STAT
"""Norm statistics and the attention logsumexp are fp32 in every kernel here."""
