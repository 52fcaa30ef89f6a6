"""How one training step is laid out over devices.

Degrees multiply to the device count: ``dp · fsdp · tp · pp · cp``. Placement follows
Megatron-LM's order (tp innermost, then cp, fsdp, dp, pp outermost; Narayanan et al. 2021,
Sec. 3.3): a group whose span fits in one node talks over NVLink/ICI, otherwise over the
inter-node network. On TPU meshes, ``mx``/``my`` are the ICI axes given to FSDP and TP
(the Scaling Book's M_X, M_Y): each axis adds a link's bidirectional bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .specs import ModelSpec, TrainSpec, _flag, _positive_int

OVERLAP_RULES = ("max", "sum")


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """Degrees of each kind of parallelism and the overlap rule."""

    dp: int = 1
    """Data-parallel replicas (gradients all-reduced; with fsdp > 1 this is HSDP)."""
    fsdp: int = 1
    """Sharding group X: ZeRO over these devices."""
    zero: int = 3
    """ZeRO stage over the fsdp group: 1 optimizer state, 2 + gradients, 3 + parameters."""
    tp: int = 1
    """Tensor (Megatron) parallel degree Y."""
    sequence_parallel: bool = False
    """Shard norms and residual activations over tp too (Korthikanti et al. 2022)."""
    pp: int = 1
    """Pipeline stages."""
    pp_interleave: int = 1
    """Virtual stages per device (interleaved 1F1B; 1 is plain 1F1B)."""
    cp: int = 1
    """Context parallel degree (ring attention over the sequence)."""
    mx: int = 1
    """Mesh axes (ICI) used by the fsdp/dp group (Scaling Book M_X)."""
    my: int = 1
    """Mesh axes used by the tp group (M_Y)."""
    overlap: str = "max"
    """``max``: communication fully overlapped with compute (current Scaling Book);
    ``sum``: not overlapped (its earlier edition)."""
    bucket_mb: float = 25.0
    """Gradient bucket size for DDP all-reduces (torch DDP default 25 MiB)."""

    def __post_init__(self) -> None:
        for name in ("dp", "fsdp", "tp", "pp", "pp_interleave", "cp", "mx", "my"):
            _positive_int(self, name)
        _flag(self, "sequence_parallel")
        if self.zero not in (1, 2, 3):
            raise ValueError(f"zero must be 1, 2 or 3 (got {self.zero!r})")
        if self.overlap not in OVERLAP_RULES:
            raise ValueError(f"overlap must be max or sum (got {self.overlap!r})")
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0 (got {self.bucket_mb})")

    @property
    def devices(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp * self.cp

    def check(self, model: ModelSpec, train: TrainSpec) -> None:
        """Divisibility against a model and a batch, with errors naming both sides."""
        pairs = [("n_layers", model.n_layers, "pp * pp_interleave", self.pp * self.pp_interleave)]
        if not model.ffn_only:
            pairs += [("n_heads", model.n_heads, "tp", self.tp)]
        pairs += [
            ("d_ff", model.d_ff, "tp", self.tp),
            ("seq", train.seq, "cp", self.cp),
            (
                "batch",
                train.batch,
                "dp * fsdp * grad_accum",
                self.dp * self.fsdp * train.grad_accum,
            ),
        ]
        if self.sequence_parallel:
            pairs.append(("seq / cp", train.seq // self.cp, "tp", self.tp))
        for name, value, by_name, by in pairs:
            if value % by:
                raise ValueError(
                    f"{by_name} must divide {name} (got {name}={value}, {by_name}={by})"
                )
        kv = model.n_kv_heads
        if not model.ffn_only and kv % self.tp and self.tp % kv:
            raise ValueError(
                f"tp must divide n_kv_heads or be a multiple of it "
                f"(got tp={self.tp}, n_kv_heads={kv})"
            )
        if self.cp > 1 and train.attention != "flash":
            raise ValueError("cp > 1 needs attention=flash (ring attention)")
        if self.pp_interleave > 1 and self.pp == 1:
            raise ValueError("pp_interleave > 1 needs pp > 1")

    def replace(self, **changes: Any) -> ParallelSpec:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = sorted(set(changes) - set(values))
        if unknown:
            raise ValueError(f"unknown ParallelSpec field(s): {', '.join(unknown)}")
        return ParallelSpec(**{**values, **changes})


def fill_dp(parallel: ParallelSpec, gpus: int) -> ParallelSpec:
    """Data parallelism fills the devices the other degrees leave."""
    other = parallel.fsdp * parallel.tp * parallel.pp * parallel.cp
    if gpus % other:
        raise ValueError(f"fsdp * tp * pp * cp must divide gpus (got {other} and gpus={gpus})")
    return parallel.replace(dp=gpus // other)
