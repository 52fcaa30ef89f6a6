"""The reference model (``validate/reference/model.py``) under torch.autocast, torch DDP,
ZeRO 1/2/3 over fsdp, DTensor tensor parallelism and ``torch.distributed.pipelining``:
fp32 parameters with low-precision weight casts kept from forward to backward, an fp32
residual stream, DDP's flat gradient buckets, RoPE and mask tables made in every forward
(measured per rank by ``validate.distributed.memory``)."""

from __future__ import annotations

from costmodel.frameworks.registry import Framework
from costmodel.specs.frameworks import TRAITS


class Reference(Framework):
    """This project's own model, as ``validate/`` runs it."""

    traits = TRAITS["reference"]


FRAMEWORK = Reference()
