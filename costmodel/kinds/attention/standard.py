"""Standard multi-head attention's projections: MHA (Vaswani et al. 2017), GQA (Ainslie et
al. 2023: K key/value heads shared by H / K query heads) and MQA (Shazeer 2019, K = 1).

A block projects its normed input to H query heads and K key and value heads of d_h, runs
the core (``costmodel.kinds.attention.causal`` / ``window``) and projects the H·d_h output
back to D. Under tensor parallelism each projection's heads split over the Y ranks
(Shoeybi et al. 2019, Sec. 3). What the block keeps for backward is the reference model's
(``validate/reference/model.py``). Units: parameters, bytes per micro-batch, FLOPs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds.ops import STAT
from costmodel.symbols.core import D, H, K, L, T, Y, b, d_h, smax
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class Standard:
    """Q, K, V and O projections around the core; heads of d_h."""

    name = "standard"
    field = None
    """The ModelSpec field that selects this kind (none: the default)."""
    title = "multi-head attention"
    eager = True
    """Whether the reference model's eager op-by-op counts are modelled for it."""
    offload = True
    """Whether offload plans are modelled for its blocks."""

    def matrices(self, model: Any) -> list[tuple[str, sp.Expr, sp.Expr]]:
        """One block's matrices in forward order as (op, fan-in, fan-out)."""
        return [("attn_q", D, H * d_h), ("attn_k", D, K * d_h), ("attn_v", D, K * d_h),
                ("attn_o", H * d_h, D)]  # fmt: skip

    def head_widths(self, model: Any, kernel: str) -> tuple[sp.Expr, sp.Expr]:
        """(query/key, value) width of a head in the core."""
        return d_h, d_h

    def norm_widths(self, model: Any) -> list[sp.Expr]:
        """Widths of the norms a block has beyond its two and QK-norm's: none."""
        return []

    def rope_width(self, model: Any) -> sp.Expr:
        """Width of the rotary tables' rows: the head's."""
        return d_h

    def shapes(
        self, model: Any, sequence_parallel: bool = False
    ) -> dict[str, list[tuple[sp.Expr, sp.Expr, sp.Expr]]]:
        """Per-device (rows per token, k, n2) of each projection under tensor parallelism
        Y: every matrix split by heads, over the whole (gathered) sequence."""
        one = integer(1)
        return {"attn_q": [(one, D, H * d_h / Y)], "attn_k": [(one, D, K * d_h / Y)],
                "attn_v": [(one, D, K * d_h / Y)], "attn_o": [(one, H * d_h / Y, D)]}  # fmt: skip

    def gathered_width(self, model: Any) -> sp.Expr:
        """The block input's D."""
        return D

    def duplicated(self, model: Any) -> sp.Expr:
        """None: every matrix is split by heads."""
        return integer(0)

    def ring_widths(self, model: Any, kernel: str) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """H query heads and K key and value heads of d_h."""
        return H * d_h, K * d_h, K * d_h

    def core_traffic(self, model: Any, kernel: str, b_dev: Any, t_dev: Any, a: int) -> tuple:
        """(FLOPs per query-key pair, bytes of Q, K, V and O) of one micro-batch's core on
        a device: QKᵀ and PV, 2 FLOPs a multiply-add over d_h each."""
        per_pair = 4 * b_dev * (H / Y) * d_h * t_dev / T
        return per_pair, a * b_dev * t_dev * (2 * H + 2 * K) * d_h / Y

    def kept(self, model: Any, train: Any, act: int, mm: int) -> dict[str, sp.Expr]:
        """Bytes the L blocks keep for the core and the out-projection: the checkpointed
        core's inputs (selective); the naive core's Q, K and V copies at H heads for the
        batched matmuls and the probabilities (and dropout's mask and output), the
        out-projection's input; the fused kernel's Q, K, V, O and fp32 logsumexp (Dao
        2023, FlashAttention-2, Alg. 1-2), whose O is the out-projection's input."""
        q = act * b * T * H * d_h
        kv = 2 * act * b * T * K * d_h
        if train.recompute == "selective":  # checkpointed core keeps only its inputs
            core = q + kv + (q if train.attention == "flash" else 0)
            parts = {"attention": L * core}
        elif train.attention == "naive":
            dropped = (act + 1) * b * H * T * T if train.dropout else 0
            parts = {"attention": L * (3 * q + act * b * H * T * T + dropped)}
        else:
            parts = {"attention": L * (q + kv + q + STAT * b * H * T)}
        if train.attention == "naive":  # flash's O is already O's input
            parts["attn_out_input"] = L * mm * b * T * H * d_h
        return parts

    def cached(self, model: Any) -> sp.Expr:
        """A key and a value per kv head: 2·K·d_h per token, the K heads split over tp's Y
        ranks, each rank keeping at least one (vLLM replicates kv heads when Y > K)."""
        return 2 * d_h * kv_heads_per_device()

    def decode_widths(self, model: Any) -> tuple[sp.Expr, sp.Expr]:
        """A query head scores d_h-wide keys and sums d_h-wide values."""
        return d_h, d_h

    def split_shares(self, model: Any) -> list[Any]:
        """Per matrix of :meth:`matrices`, the share one of tp's Y ranks holds when
        serving: Q and O split by heads (1/Y), K and V by kv heads (at least one per
        rank)."""
        kv = kv_heads_per_device() / K
        return [1 / Y, kv, kv, 1 / Y]


def kv_heads_per_device() -> sp.Expr:
    """kv heads on each of tp's Y ranks: K / Y, or one replicated head where Y > K."""
    return smax(K / Y, 1)


STANDARD = Standard()
