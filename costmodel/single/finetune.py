"""Parameter-efficient fine-tuning: LoRA adapters beside frozen weights, and QLoRA's 4-bit
frozen base (parameters, bytes; FLOPs are in ``costmodel.single.flops``).

LoRA (Hu et al. 2021, Sec. 4.1) freezes every weight W (fan-in m, fan-out n) and trains
y = W x + (α/r)·B A x beside the adapted ones, A (r x m) and B (n x r): r·(m + n) trained
parameters per adapted matrix, with their gradients, optimizer state and (under mixed
precision) fp32 master and low-precision casts; the frozen weights are stored once in the
compute dtype, as fine-tuning scripts load them (``from_pretrained(torch_dtype=...)``).
A frozen matrix's backward needs only dX: autograd then keeps neither its input (only an
adapter's A keeps it) nor, for the LM head, anything but the logits' log-softmax. Every
block is costed alike: the embedding's output requires a gradient (PEFT's
``enable_input_require_grads``, which QLoRA's ``prepare_model_for_kbit_training`` calls).

QLoRA (Dettmers et al. 2023, Sec. 3) stores each frozen block matrix as 4-bit NormalFloat
in blocks of 64 with one absmax each, the absmaxes quantized again to 8 bits in blocks of
256 (double quantization) around their mean: n/2 + n/64 + 4·n/(64·256) + 4 bytes for n
weights (0.127 bits of constants per weight, Sec. 3 "Double Quantization"); the embedding,
head and norms stay in the compute dtype (bitsandbytes skips ``lm_head``). Each matmul
dequantizes its matrix to the compute dtype and keeps nothing for backward, which
dequantizes again (bitsandbytes' ``MatMul4Bit``). Units: parameters, bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds.ffn import dense
from costmodel.single.params import attention_matrices, ffn_matrices, param_breakdown
from costmodel.single.precision import PRECISIONS
from costmodel.specs.finetune import LORA_TARGETS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.core import D, F, H, K, L, T, b, d_h, r_a
from costmodel.symbols.ops import integer, is_zero, sceil

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

NF4_BLOCK = 64  # weights per absmax (QLoRA, Sec. 3; bitsandbytes' default blocksize)
ABSMAX_BLOCK = 256  # absmaxes per second-level fp32 scale (double quantization)


def tunes(train: TrainSpec) -> bool:
    """Whether the model's own weights are frozen (LoRA or QLoRA)."""
    return train.finetune != "full"


def residual(train: TrainSpec) -> int:
    """Bytes of a residual-stream element: the compute dtype's when the frozen embedding
    and norms are stored in it (the stream starts there), else the precision's."""
    prec = PRECISIONS[train.precision]
    return prec.activation if tunes(train) else prec.residual


def adapted(model: ModelSpec, train: TrainSpec) -> list[tuple[str, sp.Expr, sp.Expr, int]]:
    """One block's adapted matrices as (op, fan-in, fan-out, how many)."""
    if not tunes(train):
        return []
    targets = LORA_TARGETS[train.lora_targets]
    out = [(op, m, n, 1) for op, m, n in attention_matrices(model) if op in targets]
    if "ffn" in targets:
        out += [("ffn", D, F, ffn_matrices(model) - 1), ("ffn", F, D, 1)]
    return out


def adapts(model: ModelSpec, train: TrainSpec, op: str, down: bool = False) -> bool:
    """Whether ``op``'s matrices (with ``down``, the FFN's down projection) have adapters."""
    return any(o == op and (not down or n == D) for o, _, n, _ in adapted(model, train))


def adapter_params(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Trained adapter parameters: r·(fan-in + fan-out) per adapted matrix, L blocks."""
    per_block = sum((c * (m + n) for _, m, n, c in adapted(model, train)), integer(0))
    return L * r_a * per_block


def adapter_inputs(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Per token, the ranks of every block's adapters: the A outputs each B keeps."""
    return L * r_a * sum((c for *_, c in adapted(model, train)), integer(0))


def trainable_params(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Parameters with a gradient and optimizer state: all (full) or the adapters."""
    return adapter_params(model, train) if tunes(train) else param_breakdown(model)["total"]


def block_weights(model: ModelSpec) -> list[tuple[sp.Expr, sp.Expr]]:
    """Every block matrix (biases excluded) as (how many, elements each): what QLoRA
    quantizes."""
    mats = ffn_matrices(model)
    return [(L * (mats - 1), D * F), (L, F * D), (L, D * H * d_h), (2 * L, D * K * d_h),
            (L, H * d_h * D)]  # fmt: skip


def nf4_bytes(n: sp.Expr) -> sp.Expr:
    """Bytes of one n-weight matrix in double-quantized NF4: packed 4-bit codes, an 8-bit
    absmax per 64 weights, an fp32 scale per 256 absmaxes and the absmaxes' fp32 mean."""
    blocks = sceil(n / NF4_BLOCK)
    return sceil(n / 2) + blocks + 4 * sceil(blocks / ABSMAX_BLOCK) + 4


def frozen_bytes(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Bytes of the frozen model: every weight in the compute dtype (LoRA), the block
    matrices in NF4 (QLoRA); 0 when fully trained."""
    if not tunes(train):
        return integer(0)
    act = PRECISIONS[train.precision].activation
    total = act * param_breakdown(model)["total"]
    if train.finetune == "qlora":
        for count, n in block_weights(model):
            total += count * (nf4_bytes(n) - act * n)
    return total


def frozen_block_bytes(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Bytes of one block's frozen matrices as stored (what ZeRO-3 gathers for a block)."""
    if train.finetune == "qlora":
        return sum((c * nf4_bytes(n) for c, n in block_weights(model)), integer(0)) / L
    act = PRECISIONS[train.precision].activation
    return act * sum((c * n for c, n in block_weights(model)), integer(0)) / L


def dequantized(model: ModelSpec, train: TrainSpec, split: Any = 1) -> sp.Expr:
    """Bytes of the largest block matrix dequantized to the compute dtype for its matmul
    (QLoRA; 0 otherwise), alive beside backward's end (the first block's dX)."""
    if train.finetune != "qlora":
        return integer(0)
    return PRECISIONS[train.precision].activation * D * F / split


def adjust_activations(model: ModelSpec, train: TrainSpec, parts: dict[str, sp.Expr]) -> None:
    """What frozen weights change in :func:`costmodel.single.memory.activation_memory`'s
    parts, in place: a frozen matrix keeps no input, so the FFN's input is kept only for an
    adapter's A on it, the FFN's down-projection input (and naive attention's
    out-projection input, and a checkpointed fused core's output) only where adapted, the
    head's input not at all, nor the learned
    positions' indices; each adapter's B keeps its A's output (r per token)."""
    if not tunes(train):
        return
    mm = PRECISIONS[train.precision].matmul_input
    for part, keep in (("ffn_input", adapts(model, train, "ffn")),
                       ("attn_out_input", adapts(model, train, "attn_o")),
                       ("lm_head_input", False), ("embedding", False)):  # fmt: skip
        if part in parts and not keep:
            parts[part] = integer(0)
    checkpointed_flash = train.recompute == "selective" and train.attention == "flash"
    if checkpointed_flash and not adapts(model, train, "attn_o"):  # the core's output is
        act = PRECISIONS[train.precision].activation  # O's input, kept by O's adapter only
        parts["attention"] -= L * act * b * T * H * d_h
    into_down = dense.activation(model).kept[1]  # the product (or GELU) W2 alone keeps
    if "ffn_hidden" in parts and into_down and not adapts(model, train, "ffn", True):
        parts["ffn_hidden"] -= L * b * T * mm * F * into_down
    if "block_inputs" not in parts:
        parts["adapters"] = mm * b * T * adapter_inputs(model, train)
    for part in [k for k, e in parts.items() if is_zero(e)]:
        del parts[part]


def dequantize_traffic(model: ModelSpec, train: TrainSpec) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes one micro-batch moves dequantizing QLoRA's block matrices:
    each read in NF4 and written in the compute dtype, for the forward matmul and again for
    backward's dX (memory-bound; 0 unless QLoRA)."""
    if train.finetune != "qlora":
        return integer(0), integer(0)
    act = PRECISIONS[train.precision].activation
    moved = sum((c * (nf4_bytes(n) + act * n) for c, n in block_weights(model)), integer(0))
    return moved, moved
