"""The reference model served op by op (the ``eager`` engine): its kernels' dispatch on the
host and its elementwise bytes, which a serving engine's fused kernels and CUDA graphs do not
pay (seconds). On a CPU every engine dispatches its kernels on the calling thread, so the
dispatch is priced for any engine there."""

from __future__ import annotations

from costmodel.kinds import attention, ffn
from costmodel.single.elementwise import eager_bytes
from costmodel.single.kernels import layer_kernels, model_kernels
from costmodel.single.precision import PRECISIONS
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.serving import ServeSpec
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import F, H, K, Y, as_expr, values_for


def _eager_precision(spec: ServeSpec) -> str:
    """The training precision whose eager kernels and bytes the reference model's serving
    runs: fp32 throughout, or 16-bit compute over fp32 residuals."""
    return "fp32" if spec.precision == "fp32" else "bf16-mixed"


def host_s(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> float:
    """Host seconds to dispatch one step's kernels in an eager engine (the reference model),
    or in any engine on a CPU: the training forward's kernel counts
    (``costmodel.single.kernels``) times ``Hardware.dispatch_s``, or on an accelerator whose
    profile states none (the catalog's) the engine's own measured seconds per kernel
    (``Engine.dispatch_s``: eager PyTorch on an x86 GPU node); 0 for a fused engine on an
    accelerator (it replays CUDA graphs) and for kinds whose eager counts are not
    modelled."""
    graphed = spec.engine_kind.fused and hw.kind != "cpu"
    per_kernel = hw.dispatch_s or (spec.engine_kind.dispatch_s if hw.kind != "cpu" else 0.0)
    if graphed or not per_kernel or not attention.projections(model).eager:
        return 0.0
    prec = _eager_precision(spec)
    train = TrainSpec(batch=1, seq=2, precision=prec, elementwise="eager")  # op by op
    residual = PRECISIONS[prec].residual
    kernels = sum(
        n * layer_kernels(model, train, residual, block=k.name)[0] for k, n in ffn.blocks(model)
    )
    total = as_expr(kernels + model_kernels(model, train, residual)[0]).xreplace(
        by_symbol(values_for(model))
    )
    return int(total) * per_kernel  # an MoE block's counts are in its sizes' symbols


def elementwise_s(model: ModelSpec, spec: ServeSpec, hw: Hardware, tokens: int) -> float:
    """Seconds of ``tokens``' elementwise work through the layers in an eager engine: the
    reference model's bytes per token and layer (``costmodel.single.elementwise``, heads and
    FFN split over tp) at the HBM bandwidth; 0 for a fused engine, and for kinds whose eager
    bytes are not modelled."""
    if spec.engine_kind.fused or not attention.projections(model).eager:
        return 0.0
    prec = PRECISIONS[_eager_precision(spec)]
    vals = {**values_for(model), Y: spec.tp}
    per_token = 0.0
    for kind, count in ffn.blocks(model):
        fwd = eager_bytes(model, prec.residual, prec.activation, block=kind.name)[0]
        split = fwd.xreplace(by_symbol({F: F / Y, H: H / Y, K: K / Y}))
        per_token += float((count * split).xreplace(by_symbol(vals)))
    return tokens * per_token / hw.hbm_bandwidth()
