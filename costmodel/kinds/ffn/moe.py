"""The mixture-of-experts FFN: a router sends each token to k of E routed experts, beside
E_s shared experts every token runs (Shazeer et al. 2017; GShard, Lepikhin et al. 2020;
Switch Transformer, Fedus et al. 2022; Mixtral, Jiang et al. 2024; DeepSeekMoE, Dai et al.
2024; Qwen1.5-MoE, Qwen Team 2024).

The router is a bias-free D x E linear (with the shared experts' D x 1 sigmoid gate where
they have one, Qwen2-MoE); each expert is a dense FFN of width F_e of the model's
activation (``costmodel.kinds.ffn.dense``); the shared experts run as one FFN of width
E_s·F_e. What a block keeps, moves and dispatches is the reference model's
(``validate/reference/moe.py``); fused counts are those of grouped-GEMM frameworks
(Megatron's GroupedMLP, torchtitan's grouped_mm). Routing balance under expert parallelism:
the busiest rank receives ``ep_imbalance`` (rho_ep) times the mean of the routed pairs, at
most the capacity factor (c_cap) of them (Fedus et al. 2022, Sec. 2.2). Units: parameters,
FLOPs, bytes per token, kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds.ffn import dense
from costmodel.kinds.ops import INDEX_BYTES, STAT, cast_bytes, differ
from costmodel.specs.model import ModelSpec
from costmodel.symbols.core import (
    D,
    E_r,
    E_s,
    F_e,
    N_ep,
    N_etp,
    Y,
    at_least_one,
    c_cap,
    c_pad,
    k_r,
    more_than_one,
    rho_ep,
    smax,
    smin,
)
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def router_width(model: ModelSpec) -> sp.Expr:
    """Outputs of an MoE block's gating matmuls over D: the router's E scores, and the
    shared experts' sigmoid gate (Qwen2-MoE)."""
    return E_r + (1 if model.shared_expert_gate else 0)


def routed_to_busiest() -> sp.Expr:
    """Routed token-expert pairs sent to the busiest rank's experts over the mean: the
    stated ``ep_imbalance`` under expert parallelism; 1 without it (every rank runs its
    own tokens' pairs, wherever they are routed)."""
    return 1 + (rho_ep - 1) * more_than_one(N_ep)


def kept_by_busiest() -> sp.Expr:
    """Routed pairs the busiest rank's experts keep over the mean: what is sent to it, at
    most the capacity factor (pairs past an expert's capacity are dropped before dispatch;
    the rank's load spread over its experts)."""
    return smin(routed_to_busiest(), c_cap)


def busiest_experts() -> sp.Expr:
    """Routed pairs (and padding) the busiest rank's experts run over the mean: those it
    keeps, or its whole capacity where the dispatch pads every expert to it
    (``ParallelSpec.capacity_pad``: Megatron-Core's ``drop_and_pad``, GShard's dense
    dispatch)."""
    return smax(kept_by_busiest(), c_pad)


def dropped_fraction() -> sp.Expr:
    """The fraction of the pairs routed to the busiest rank that its capacity drops."""
    return 1 - kept_by_busiest() / routed_to_busiest()


def kept_fraction() -> sp.Expr:
    """The fraction of a rank's own pairs that capacity keeps: the busiest rank drops
    (routed - capacity) x the mean, taken evenly from the ep ranks' tokens (1 dropless)."""
    return 1 - (routed_to_busiest() - kept_by_busiest()) / N_ep


def kept(model: ModelSpec, act: int, mm: int) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """Per token, what one MoE FFN keeps besides its input, as (beside the token, beside
    its routed pairs, at its experts): beside the token, the fp32 router probabilities
    (softmax output), the top-k indices (int64) and the top-k probabilities with their sum
    (the renormalisation's operands, fp32, where it renormalises) and the shared experts'
    hidden activations (and, gated, the gate's sigmoid and the output it scales); per
    routed token-expert pair its token and slot indices (int64), the expert's output and
    its weight (the weighting product's operands) and the weighted output (``index_add``
    keeps its source, whose shape its backward names); at the experts, per routed pair
    its gathered input (the expert's matmul input) and the expert's hidden activations.
    Under expert parallelism the third part is on the rank holding the expert, and a pair
    its capacity drops keeps neither of the last two."""
    router = STAT * E_r + INDEX_BYTES * k_r
    if model.moe_renormalize:  # the division's operands: the top-k values and their sum
        router += STAT * (k_r + 1)
    shared = dense.hidden_kept(model, act, mm, E_s * F_e)
    if model.shared_expert_gate:  # the sigmoid's output and what it scales
        shared += act + act * D
    beside = 2 * INDEX_BYTES + 2 * act * D + act
    at_expert = mm * D + dense.hidden_kept(model, act, mm, F_e)
    return router + shared, k_r * beside, k_r * at_expert


def moved(model: ModelSpec, a: int) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) eager bytes per token of an MoE FFN.

    Router: the logits' fp32 cast, softmax (8E), top-k (reads 4E, writes k values and int64
    indices), the renormalisation's sum and division (where it renormalises), the weights'
    cast; backward the softmax's (12E), top-k's scatter into zeros, the division's five
    ops and sum, and the add of the two paths. Every expert reads whole per-token tensors
    each step: its mask compares all the indices (9k), nonzero reads the mask (k), the
    gathers read all the inputs (aD) and weights (ak), the out-of-place index_add reads
    and writes all the outputs (2aD); backward the same for the gathers' scatters into
    zeros and the index_add's gather. Per routed pair: the gathered rows and their int64
    indices, the expert's activation (as a dense FFN's), the weighting product and its
    gradients (the weight's a product and a sum over D). The gradients of the input add
    up over the E experts, the router and the shared FFN; the weights' over the experts.
    """
    c = cast_bytes(a, STAT, integer(1))  # a + 4 where the compute dtype is not fp32
    act_f, act_b = dense.hidden_moved(model, a, F_e)
    shared_f, shared_b = dense.hidden_moved(model, a, E_s * F_e)
    shared_input = dense.DENSE.input_consumers(model) * 3 * a * D  # SwiGLU's gate and up
    shared = at_least_one(E_s)
    renorm = int(model.moe_renormalize)
    fwd = c * E_r + 8 * E_r + 4 * E_r + 12 * k_r + (4 * k_r + 4 + 8 * k_r + 4) * renorm + c * k_r
    fwd += E_r * (9 * k_r + k_r + a * D + a * k_r + 2 * a * D)
    pair = 16 + (8 + a * D) + (16 + a) + (2 * a * D + a) + (8 + a * D)
    fwd += k_r * (pair + act_f) + shared * shared_f
    div = 48 * k_r + 16 - (4 * k_r + 4) * (1 - more_than_one(k_r))  # k = 1: no sum
    bwd = c * E_r + 12 * E_r + 8 * E_r + 12 * k_r + (div + 12 * k_r) * renorm + c * k_r
    bwd += E_r * (a * D + 2 * a * D + 2 * a * k_r) + (E_r + shared) * 3 * a * D
    bwd += (E_r - 1) * 3 * a * k_r
    pair = (8 + a * D) + (2 * a * D + a) + 3 * a * D + (a * D + a) + (8 + a * D) + (16 + a)
    bwd += k_r * (pair + act_b + shared_input) + shared * (shared_b + shared_input)
    if model.shared_expert_gate:  # sigmoid and the product (the gate's (n, 1) operand per
        # token); backward the product's two gradients, the gate's sum over D, sigmoid's,
        # and the add of the input's gradient from the gate's matmul
        fwd += 2 * a + 2 * a * D + a
        bwd += (2 * a * D + a) + 3 * a * D + (a * D + a) + 3 * a + 3 * a * D
    return fwd, bwd


def eager_kernels(model: ModelSpec, prec: Any) -> tuple[Any, Any]:
    """(forward, backward) kernels of an MoE FFN (``validate/reference/moe.py``).

    Router: its matmul and weight cast, the logits' fp32 cast, softmax, top-k, the sum and
    division of the renormalisation (where it renormalises), the weights' cast; backward
    the matmul's two gradients, softmax's, top-k's scatter into zeros, and the division's
    (three divisions, a negation, a product and, for k > 1, a sum to the denominator's
    shape, and the add of its two paths). A shared gate (Qwen2-MoE) as its comment says.
    Shared experts: one FFN (their gradient added into the input's), or the zeros the
    routed outputs are added into. Each routed expert, every step: the mask, its nonzero,
    the gathers of its tokens and weights, its FFN, the weighting product and the
    index_add; backward the gathers' scatters into zeros, the index_add's gather, the
    product's two gradients and the weight's sum over D, and the adds of its input and
    weight gradients into the others'.
    """
    cast, wide = differ(prec.param, prec.activation), 2 * differ(prec.activation, STAT)
    ffn = dense.kernels(model, prec.param, prec.activation)
    shared = at_least_one(E_s)  # counts are sizes' symbols: one structure serves every size
    fwd = 3 + cast + wide + shared * ffn[0] + (1 - shared)
    bwd = 4 + cast + wide + shared * (ffn[1] + 1)
    if model.moe_renormalize:  # sum and division; backward the division's, for k = 1
        fwd, bwd = fwd + 2, bwd + 6 + more_than_one(k_r)  # no sum, and the paths' add
    if model.shared_expert_gate:  # its matmul, sigmoid and product; backward the matmul's
        # two gradients, the product's two and a sum over D, the sigmoid's, the input's add
        fwd, bwd = fwd + 3 + cast, bwd + 7 + cast
    return fwd + E_r * (6 + ffn[0]), bwd + E_r * (10 + ffn[1])


class MoE:
    """An MoE block's FFN: router, E routed experts (k per token), E_s shared ones."""

    name = "moe"
    ops = ("router", "experts", "shared_experts")
    kept_parts = ("moe", "moe_routed", "moe_experts")
    routes = True
    field = "n_experts"
    """The ModelSpec field that selects this kind (> 0)."""
    title = "mixture-of-experts models"
    offload = False
    """Offload plans do not model its blocks (dense leading ones and its op sequence)."""
    """Its parts of ``activation_memory``: beside its tokens, beside their routed pairs
    and at its experts (:func:`kept`)."""
    grouped_ops = ("experts",)
    """Its routed experts' matmuls: one problem per local expert (Transformer Engine's
    GroupedLinear, Megatron-Core's grouped GEMM, torch's ``_grouped_mm``)."""

    def params(self, model: ModelSpec) -> dict[str, sp.Expr]:
        return {
            "router": D * router_width(model),
            "experts": E_r * dense.params(model, F_e),
            "shared_experts": dense.params(model, E_s * F_e) * at_least_one(E_s),
        }

    def unused(self, model: ModelSpec) -> sp.Expr:
        """Parameters a token does not run through: the E - k experts it is not sent to."""
        return (E_r - k_r) * dense.params(model, F_e)

    def routed(self, model: ModelSpec) -> tuple[sp.Expr, sp.Expr]:
        """(parameters, matmul weights) of the routed experts: what ep splits."""
        return E_r * dense.params(model, F_e), E_r * dense.matrices(model) * D * F_e

    def matmul_weights(self, model: ModelSpec) -> sp.Expr:
        return D * router_width(model) + dense.matrices(model) * D * F_e * (E_r + E_s)

    def weight_matrices(self, model: ModelSpec) -> list[tuple[sp.Expr, sp.Expr]]:
        up = dense.matrices(model) - 1
        return [(integer(1), D * router_width(model)), (E_r * up, D * F_e), (E_r, F_e * D),
                (integer(up), D * E_s * F_e), (integer(1), E_s * F_e * D)]  # fmt: skip

    def forward_flops(self, model: ModelSpec) -> dict[str, sp.Expr]:
        """Per token: the router, its k routed experts and the shared ones."""
        mats = dense.matrices(model)
        return {
            "router": 2 * D * router_width(model),
            "experts": k_r * mats * 2 * D * F_e,
            "shared_experts": E_s * mats * 2 * D * F_e,
        }

    def hidden_width(self, model: ModelSpec) -> sp.Expr:
        """The larger of the shared experts' (E_s·F_e over every token) and one routed
        expert's (F_e over its k/E share of the tokens): backward runs one at a time."""
        return smax(E_s * F_e, k_r * F_e / E_r)

    def kept(self, model: ModelSpec, act: int, mm: int) -> dict[str, sp.Expr]:
        return dict(zip(self.kept_parts, kept(model, act, mm), strict=True))

    def kept_scales(
        self, model: ModelSpec, act: int, mm: int, weighted: bool = True
    ) -> dict[str, sp.Expr]:
        """At the experts: the pairs the busiest ep rank's experts run, their gathered
        inputs etp times over (each etp rank keeps every pair its expert group gathers,
        and 1/etp of each pair's hidden activations); beside the routed pairs: its own
        tokens' pairs that capacity keeps, without the weighted output where the combine
        keeps the expert's alone (``weighted`` False: :func:`kept`'s pair part less one
        act·D)."""
        hidden = dense.hidden_kept(model, act, mm, F_e)
        gathered = (N_etp * mm * D + hidden) / (mm * D + hidden)
        routed = kept_fraction()
        if not weighted:
            both = 2 * INDEX_BYTES + 2 * act * D + act
            routed = routed * (both - act * D) / both
        return {"moe_experts": busiest_experts() * gathered, "moe_routed": routed}

    def moved(self, model: ModelSpec, a: int) -> tuple[sp.Expr, sp.Expr]:
        return moved(model, a)

    def bias_outputs(self, model: ModelSpec) -> sp.Expr:
        """Biases' outputs per token: each routed pair's expert and the shared FFN's."""
        up = dense.matrices(model) - 1
        return k_r * (D + up * F_e) + at_least_one(E_s) * (D + up * E_s * F_e)

    def input_consumers(self, model: ModelSpec) -> int:
        """Counted in :func:`moved` (the router, experts and shared FFN's adds)."""
        return 0

    def eager_kernels(self, model: ModelSpec, prec: Any) -> tuple[Any, Any]:
        return eager_kernels(model, prec)

    def fused_kernels(self, model: ModelSpec) -> tuple[Any, Any]:
        """Beyond the block's matmuls (one grouped GEMM per expert matrix): the router's
        fused softmax/top-k, the tokens' permutation to their experts and back, and the
        shared experts' FFN with its activation."""
        mats = dense.matrices(model)
        shared = at_least_one(E_s)
        return 4 + shared * (mats + 1), 2 + 4 + shared * (2 * mats + 1)

    def graphed_kernels(self, model: ModelSpec) -> tuple[Any, Any, int]:
        """What Megatron-Core's ``moe_router`` and ``moe_preprocess`` graph scopes capture,
        as one graph: the router's matmul (and the shared gate's), its fused softmax/top-k
        and the tokens' first permutation; backward their gradients (the matmul's two)."""
        gate = 1 if model.shared_expert_gate else 0
        return 3 + gate, 4 + 2 * gate, 1

    def gemms(self, model: ModelSpec) -> dict[str, list[tuple[sp.Expr, ...]]]:
        """One device's matmuls, per token of the device's sequence (all of it under
        tensor parallelism, as the dense layers' column-parallel matmuls see it): the
        router over the device's own 1/tp sequence shard (sequence parallelism); each of
        the device's E/ep routed experts over the k·ep/E share of its expert group's
        tokens routing sends it, gathered over the etp ranks that split its width
        (balanced routing, times ``ep_imbalance`` on the busiest rank; its weights are
        read once per step whatever it gets); the shared experts as one tensor-parallel
        FFN of their summed width (none when E_s is 0). Megatron-Core's expert layers
        (``MoELayer``: the router on the sequence shard, experts split by
        ``expert_tensor_parallel_size``, the shared expert by tp)."""
        up = dense.matrices(model) - 1
        shared = at_least_one(E_s)
        rows = k_r * N_ep / E_r * busiest_experts() * N_etp / Y
        experts, width, mine = E_r / N_ep, F_e / N_etp, 1 / Y
        gate = [(mine, D, integer(1), integer(1))] if model.shared_expert_gate else []
        return {
            "router": [(mine, D, E_r, integer(1)), *gate],
            "experts": [(rows, D, width, up * experts), (rows, width, D, experts)],
            "shared_experts": [
                (shared, D, E_s * F_e / Y, integer(up)),
                (shared, E_s * F_e / Y, D, integer(1)),
            ],
        }


MOE = MoE()
