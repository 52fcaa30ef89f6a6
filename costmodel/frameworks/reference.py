"""The reference model (``validate/reference/model.py``) under torch.autocast, torch DDP,
ZeRO 1/2/3 over fsdp, DTensor tensor parallelism and ``torch.distributed.pipelining``:
fp32 parameters with low-precision weight casts kept from forward to backward, an fp32
residual stream, DDP's flat gradient buckets, RoPE and mask tables made in every forward
(measured per rank by ``validate.distributed.memory``)."""

from __future__ import annotations

from costmodel.frameworks.registry import Framework


class Reference(Framework):
    """This project's own model, as ``validate/`` runs it."""

    name = "reference"
    autocast = True
    ddp_buckets = True
    rebuilds_tables = True
    dtensor_tp = True
    torch_pipelining = True
    zero3_prefetch = True
    finetunes = True
    zero_stages = True

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """ZeRO 1/2/3 over every replica, or DDP over them (no sharding)."""
        zero = super().shardings(replicas)
        return [*zero, (replicas, 1, 1)] if replicas > 1 else zero


FRAMEWORK = Reference()
