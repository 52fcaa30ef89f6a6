"""The hardware profile: one device and how it connects to the others (validated).

Units: FLOP/s, bytes, bytes/s, seconds. The catalog of named devices and the loading of
measured profiles is :mod:`costmodel.catalog.hardware`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.model import FlashFamily
from costmodel.specs.offload import LINKS

DeviceKind = Literal["gpu", "tpu", "cpu"]
DEVICE_KINDS: tuple[str, ...] = get_args(DeviceKind)
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
_SHARED_KEYS = (
    "matmul", "attention", "hbm", "link", "network", "decode", "serve_matmul", "serve_grouped",
    "deepep_link", "grouped", "serve_block_fp8",
)  # fmt: skip
EFFICIENCY_KEYS = (*_SHARED_KEYS, *(f"matmul_{dtype}" for dtype in DTYPES))
"""``matmul_<dtype>`` (e.g. ``matmul_fp8``): that dtype's GEMMs' fraction of its own peak
where it differs from ``matmul`` (:meth:`Hardware.matmul_flops`). ``deepep_link``: the
fraction of the one-way NVLink that DeepEP's intranode kernels reach on this device,
measured (``costmodel.kinds.dispatch``; absent: ``link``'s). ``grouped``: the routed experts'
GEMMs' efficiency over a dense GEMM's of the same shape where a grouped linear loops over the
experts on the host (``costmodel.parallel.gemms``; absent: 1). ``serve_grouped``: a serving
step's routed experts' grouped kernel over its dense matmuls' rate
(:meth:`Hardware.serve_grouped_flops`; absent: 1). ``serve_block_fp8``: a block-scaled fp8
GEMM's rate (128 x 128 weight blocks, 1 x 128 activation groups, in the Triton kernel vLLM
and SGLang run such a checkpoint's routed experts in) over the same shape's 16-bit GEMM's,
measured side by side (absent: such GEMMs at the device's fp8 rate)."""
KERNEL_FAMILIES = tuple(k for k in get_args(FlashFamily) if k != "auto")
"""Fused-attention kernel families a profile may list (``TrainSpec.attention_kernel``)."""
KERNEL_KEYS = ("forward", "backward", "half_seq", "backward_half_seq")
"""What a profile states per kernel family (``Hardware.attention_kernels``)."""
FLASH_LESS_DTYPES = ("fp32", "tf32")
"""Dtypes no fused kernel family runs (FlashAttention and cuDNN take 16-bit inputs): torch's
SDPA runs them on its memory-efficient or math kernel, at the ``attention_flops`` measured
in that dtype where a profile has it (a kernel table describes the 16-bit kernels)."""
CALIBRATION_KEYS = ("basis", "summary", "runs", "max_mfu", "max_mfu_run")
CALIBRATION_BASES = ("published-runs", "measured", "datasheet")
_POSITIVE = ("hbm_bytes", "hbm_bw", "link_bw", "link_bw_bidir", "network_bw")
_LEAST = 1e3
"""The least memory (bytes), bandwidth (bytes/s) or peak (FLOP/s) a profile may state: a
kilobyte, a kilobyte per second, a thousand FLOP/s. Anything slower is a typo, and 1e-300
would overflow every time to infinity."""
_MOST: dict[str, tuple[int | float, str]] = {
    "hbm_bytes": (2**50, "bytes (1 PiB)"),
    **dict.fromkeys(("hbm_bw", "link_bw", "link_bw_bidir", "network_bw"), (1e17, "bytes/s")),
    "peak_flops": (1e18, "FLOP/s"), "attention_flops": (1e18, "FLOP/s"),
    **dict.fromkeys(("link_latency_s", "network_latency_s", "dispatch_s", "launch_s",
                     "expert_call_s", "serve_layer_s"), (1, "s")),
    "devices_per_node": (2**16, "devices"), "links_per_axis": (2**16, "links"),
    "sm_count": (2**20, "SMs"), "gemm_tile": (2**16, "rows or columns"),
    "power_w": (10**6, "W"), "host_slowdown": (1000, "times"), "allocator_reserve": (10, "times"),
    "gemm_half_depth": (2**32, "(a reduction depth)"),
}  # fmt: skip
"""The most a profile may state, far past any device built or announced (1e308 bytes "fit"
any model): 1 PiB (largest device 288 GB); 100 PB/s (Cerebras WSE-3's SRAM 21 PB/s, HBM 8 TB/s);
1 EFLOP/s (WSE-3 125 PFLOP/s); 1 s of latency or host time (catalog: 100 us); 65,536 devices a
node (NVL72: 72); 2^20 SMs (WSE-3: 900,000 cores); 1 MW (a WSE-3 system: 23 kW); half depths
of 2^32 (catalog: 824). Only a typo or a unit slip meets one."""


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One device and how it connects to the others."""

    name: str
    kind: DeviceKind
    """``gpu``, ``tpu`` or ``cpu``."""
    peak_flops: dict[str, float | None]
    """Dense peak FLOP/s by dtype; None where the device has no such unit."""
    hbm_bytes: float
    """Device memory capacity."""
    hbm_bw: float
    """Device memory bandwidth."""
    link_bw: float
    """One-way bandwidth per device inside a node (NVLink) or per ICI link (TPU)."""
    link_bw_bidir: float
    """Both directions of the same link."""
    links_per_axis: int
    """ICI links per mesh axis (2 on a torus: both neighbours); 1 for switched GPUs."""
    devices_per_node: int
    """Devices reachable over ``link_bw`` (one NVLink domain or TPU host)."""
    network_bw: float
    """One-way inter-node bandwidth per device (InfiniBand / DCN share)."""
    link_latency_s: float
    """alpha: per-step latency of a collective inside a node."""
    network_latency_s: float
    """alpha across nodes."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Achievable fractions: matmul and attention (of peak FLOP/s), hbm, link, network."""
    attention_flops: dict[str, float] = field(default_factory=dict)
    """Measured fused-attention FLOP/s by dtype (causal work); overrides
    ``efficiency.attention`` for that dtype (a CPU's bf16 attention need not scale with
    its bf16 matmuls)."""
    attention_kernels: dict[str, dict[str, float]] = field(default_factory=dict)
    """Fused-attention kernel families measured on this device, by name (``fa2``, ``fa3``,
    ``cudnn``, ``triton-2022``): ``forward`` and ``backward`` efficiency (fractions of the
    dense peak, causal work, at long sequences) and ``half_seq``, the key length per call at
    which a kernel reaches half of that (0: no per-length data), with ``backward_half_seq``
    the backward's where it differs (FlashAttention-2's and cuDNN's backward saturate at
    2-2.5x the forward's length on a Hopper GPU). The first is the device's
    default (``attention_kernel = "auto"``); without a table ``efficiency.attention``
    serves both passes at every length."""
    allocator_reserve: float = 1.0
    """Bytes the allocator reserves over the peak bytes allocated (PyTorch's caching
    allocator keeps freed blocks and rounds segments); ``memory_bytes_per_device.reserved``
    is the peak times this, which is what ``torch.cuda.max_memory_reserved`` reports."""
    dispatch_s: float = 0.0
    """Host seconds per kernel of an eager training step, op by op as torch dispatches them
    (Python, the autograd record, ATen dispatch, allocation and launch;
    ``costmodel.single.kernels``' eager counts). A CPU runs each kernel on the dispatching
    thread, so the two add; GPUs and TPUs run them asynchronously, so a phase takes the
    longer of the device's time and the host's. 0: not modelled (the catalog's
    accelerators); ``python -m validate.probes.calibrate`` measures it on the machine it
    runs on."""
    launch_s: float | None = None
    """Host seconds per kernel of a step whose fused kernels Python modules launch
    (Megatron-Core with Transformer Engine, the framework trait ``module_launches``;
    ``costmodel.single.kernels``' fused counts: each counted kernel stands for a module's
    Python and the launches it makes), overlapped with the device's as ``dispatch_s`` is,
    and idled once by the device at each MoE layer's host sync
    (``costmodel.parallel.host``). None: ``dispatch_s``. The catalog's GPUs: fitted
    (``costmodel/catalog/data/fitted.json``, record ``host``), times ``host_slowdown``."""
    host_slowdown: float = 1.0
    """How many times longer the node's host CPU takes for a framework's per-kernel host
    work than the x86 hosts of DGX nodes (Xeon 8480C): GB200's Grace 2.75, a torch Linear
    forward's CPU time 37.08 us against 13.48 us (Transformer Engine issue #2053, 2025).
    The fitted host seconds (``launch_s``, ``expert_call_s``) are stated for an x86 host
    and scaled by this."""

    serve_layer_s: float = 0.0
    """Device seconds per layer per serving step beyond the roofline (the gaps between a
    layer's small kernels, their launches and syncs, which a decode step of tens of
    microseconds per layer cannot hide; ``costmodel.serving.estimate``). 0: not modelled."""
    expert_call_s: float = 0.0
    """Host seconds per expert GEMM that a per-expert grouped linear launches (Transformer
    Engine's ``GroupedLinear`` under Megatron-Core: its per-expert Python work over the
    local experts' splits and one cuBLAS launch each, over 4 streams). Host time beside the
    kernels' (``costmodel.parallel.host``): the device waits for it only where the host is
    the slower. 0: not modelled (devices and frameworks without such a loop)."""
    overlap: float = 1.0
    """The share of the shorter of a phase's compute and the communication overlapped with
    it that really runs at the same time (in [0, 1]): the rest serialises, as when a
    collective's kernels and a GEMM contend for the same SMs, memory or cores. 1: overlap
    as perfect as the ``max`` rule says (the default, and the catalog's TPUs); the catalog's
    GPUs hold 0.81, Agrawal et al. 2025's measured 18.9 % mean slowdown of overlapped compute
    (arXiv 2507.03114); ``python -m validate.cluster calibrate`` measures a cluster's own (a
    GEMM chain beside an all-reduce)."""
    sm_count: int = 0
    """Streaming multiprocessors: GEMM result tiles the device computes at once; 0 (CPUs,
    TPUs, profiles that do not say) runs every GEMM shape at ``efficiency.matmul``
    (:mod:`costmodel.parallel.gemms`: tile and wave quantization)."""
    gemm_tile: tuple[int, int] = (256, 128)
    """Rows and columns of the result tile one SM computes in a large cuBLAS GEMM (NVIDIA's
    "Matrix Multiplication Background User's Guide" uses 256 x 128 on its GPUs)."""
    gemm_half_depth: dict[str, float] = field(default_factory=dict)
    """Per dtype, the reduction depth k at which its GEMMs run at half their
    ``efficiency.matmul_<dtype>``: a GEMM of depth k runs at k / (k + this) of it (a
    saturating curve; a shallow GEMM's tiles spend more of their time loading and scaling
    than multiplying). Absent or 0: every depth at the full efficiency."""
    power_w: float = 0.0
    """Board power under training load in W: the datasheet's maximum (TDP), an upper bound of
    the mean draw. 0: not stated (energy is then not reported)."""
    link_name: str = ""
    """The link ``link_bw`` is, as its vendor names it (``Infinity Fabric``, ``PCIe``); empty
    for the kind's usual one (:meth:`intranode_link`)."""
    host_link: str = "pcie5"
    """The host<->device link an offload plan streams over by default
    (``costmodel.specs.offload.LINKS``: pcie3, pcie4, pcie5, nvlink-c2c), from the
    datasheet."""
    source: str = ""
    calibration: dict[str, Any] = field(default_factory=dict)
    """What this profile's numbers were checked or fitted on: ``basis`` (``published-runs``,
    ``measured`` on the machine, or ``datasheet``, the default), ``summary`` (which
    parameters, on which published runs, with the command), ``runs`` (how many published
    runs of this device the corpus holds), ``max_mfu`` and ``max_mfu_run`` (the highest MFU
    measured on this device in the corpus, in costmodel's convention: measured tokens/s x
    model FLOPs without recomputation over the dense peak; ``python -m validate.published``
    prints it per run). Empty: datasheet only (:func:`calibration_text`)."""

    def __post_init__(self) -> None:
        try:
            self._check()
        except SpecError as err:  # name the profile: several may be in play
            raise SpecError(err.field, f"hardware {self.name}: {err.message}") from None

    def _check(self) -> None:
        checks.choice("kind", self.kind, DEVICE_KINDS)
        checks.choice("host_link", self.host_link, tuple(LINKS))
        for name in _POSITIVE:
            checks.number(name, getattr(self, name))
            if getattr(self, name) < _LEAST:
                raise SpecError(name, f"{name} must be >= {_LEAST:g} (bytes or bytes/s; got "
                                f"{getattr(self, name):g})")  # fmt: skip
        checks.number("allocator_reserve", self.allocator_reserve)
        checks.number("dispatch_s", self.dispatch_s, allow_zero=True)
        if self.launch_s is not None:
            checks.number("launch_s", self.launch_s, allow_zero=True)
        checks.number("expert_call_s", self.expert_call_s, allow_zero=True)
        checks.number("serve_layer_s", self.serve_layer_s, allow_zero=True)
        checks.number("host_slowdown", self.host_slowdown)
        checks.number("overlap", self.overlap, allow_zero=True)
        checks.number("power_w", self.power_w, allow_zero=True)
        checks.at_most("overlap", self.overlap, "1", 1)
        if self.allocator_reserve < 1:
            raise SpecError(
                "allocator_reserve",
                "allocator_reserve must be >= 1 (reserved "
                f"bytes include the allocated ones; got {self.allocator_reserve})",
            )
        for name in ("link_latency_s", "network_latency_s"):
            checks.number(name, getattr(self, name), allow_zero=True)
        for name in ("links_per_axis", "devices_per_node"):
            checks.integer(name, getattr(self, name))
        checks.integer("sm_count", self.sm_count, minimum=0)
        tile = self.gemm_tile
        if not isinstance(tile, list | tuple) or len(tile) != 2:
            raise SpecError("gemm_tile", f"gemm_tile must be [rows, cols] (got {tile!r})")
        for value in tile:
            checks.integer("gemm_tile", value)
        object.__setattr__(self, "gemm_tile", tuple(tile))  # a JSON profile gives a list
        if not isinstance(self.gemm_half_depth, dict):
            raise SpecError("gemm_half_depth", "gemm_half_depth must be an object of dtype: k")
        for dtype, depth in self.gemm_half_depth.items():
            checks.choice("gemm_half_depth", dtype, DTYPES)
            checks.number(f"gemm_half_depth.{dtype}", depth, allow_zero=True)
        for table in ("peak_flops", "efficiency", "attention_flops"):
            if not isinstance(getattr(self, table), dict):
                raise SpecError(table, f"{table} must be an object of dtype: number")
        unknown = sorted(set(self.peak_flops) - set(DTYPES))
        if unknown:
            raise SpecError("peak_flops", f"unknown peak_flops dtype(s) {unknown}")
        for table in ("peak_flops", "attention_flops"):  # apart: one dtype may be in both
            for dtype, value in getattr(self, table).items():
                if value is not None:
                    checks.number(f"{table}.{dtype}", value)
                    if value < _LEAST:
                        raise SpecError(table, f"{table}.{dtype} must be >= {_LEAST:g} FLOP/s "
                                        f"(got {value:g})")  # fmt: skip
        self._check_kernels()
        self._check_calibration()
        self._check_most()
        unknown = sorted(set(self.efficiency) - set(EFFICIENCY_KEYS))
        if unknown:
            raise SpecError("efficiency", f"unknown efficiency key(s) {', '.join(unknown)} "
                            f"(known: {', '.join(EFFICIENCY_KEYS)})")  # fmt: skip
        for key in EFFICIENCY_KEYS:
            value = self.efficiency.get(key, 1.0)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SpecError("efficiency", f"efficiency.{key} must be a number in (0, 1]")
            if not (math.isfinite(value) and 0 < value <= 1):
                raise SpecError("efficiency", f"efficiency.{key} must be in (0, 1]")

    def _check_most(self) -> None:
        """Every number at most its :data:`_MOST` (their types are checked before)."""
        for name, (most, unit) in _MOST.items():
            value = getattr(self, name)
            named = value.items() if isinstance(value, dict) else [("", value)]
            if name == "gemm_tile":
                named = zip(("rows", "cols"), value, strict=True)
            for key, v in named:
                if v is not None:
                    shown = f"{most:,}" if isinstance(most, int) else f"{most:g}"
                    checks.at_most(f"{name}.{key}" if key else name, v, shown, most, unit,
                                   field=name)  # fmt: skip

    def _check_kernels(self) -> None:
        if not isinstance(self.attention_kernels, dict):
            raise SpecError("attention_kernels", "attention_kernels must be an object of name: {}")
        for name, entry in self.attention_kernels.items():
            where = f"attention_kernels.{name}"
            checks.choice(where, name, KERNEL_FAMILIES)
            if not isinstance(entry, dict) or not {"forward", "backward"} <= set(entry):
                raise SpecError(where, f"{where} needs forward and backward efficiencies")
            for key, value in entry.items():
                checks.choice(f"{where} key", key, KERNEL_KEYS)
                checks.number(f"{where}.{key}", value, allow_zero=key.endswith("half_seq"))
                if key.endswith("half_seq"):
                    checks.at_most(f"{where}.{key}", value, "4,294,967,296", 2**32, field=where)
                elif value > 1:
                    raise SpecError(where, f"{where}.{key} must be in (0, 1] (got {value})")

    def _check_calibration(self) -> None:
        cal = self.calibration
        if not isinstance(cal, dict):
            raise SpecError("calibration", "calibration must be an object")
        for key, value in cal.items():
            checks.choice("calibration key", key, CALIBRATION_KEYS)
            if key in ("summary", "max_mfu_run") and not isinstance(value, str):
                raise SpecError(f"calibration.{key}", f"calibration.{key} must be text")
        checks.choice("calibration.basis", cal.get("basis", "datasheet"), CALIBRATION_BASES)
        if "runs" in cal:
            checks.integer("calibration.runs", cal["runs"], minimum=0)
        if "max_mfu" in cal:
            checks.number("calibration.max_mfu", cal["max_mfu"])
            if cal["max_mfu"] > 1 or "max_mfu_run" not in cal:
                raise SpecError("calibration.max_mfu", "calibration.max_mfu must be in (0, 1] "
                                "and name its run (max_mfu_run)")  # fmt: skip

    def calibration_text(self) -> str:
        """What the numbers rest on, in one line: the profile's calibration summary, or
        ``datasheet only`` where no published run checks this device."""
        return self.calibration.get("summary") or (
            "datasheet only: no published run of this device checks these numbers"
        )

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a precision's matmul dtype, with a clear error if unsupported."""
        value = self.peak_flops.get(dtype)
        if not value:
            have = ", ".join(k for k, v in self.peak_flops.items() if v)
            raise SpecError("precision", f"hardware {self.name} has no {dtype} peak (has {have})")
        return float(value)

    def attention_peak(
        self, dtype: str, kernel: str = "auto", phase: str = "forward", seq: Any = None
    ) -> Any:
        """Achieved fused-attention FLOP/s in ``dtype`` of ``kernel``'s ``phase`` (forward or
        backward) at ``seq`` keys per call (a number or an array; None: the long-sequence
        limit): peak x efficiency x seq / (seq + half_seq), the saturation FlashAttention-3's
        per-length benchmarks follow within 2.4 % rms (Shah et al. 2024, Fig. 4-5), and torch's
        FlashAttention-2 and cuDNN kernels measured on a lent H200 within 0.8-2.0 % rms with
        a half length per pass (``benchmarks/attention_kernels.py``). ``auto`` in a dtype no
        kernel family runs (:data:`FLASH_LESS_DTYPES`) is its measured rate where there is
        one."""
        if kernel == "auto" and dtype in FLASH_LESS_DTYPES and self.attention_flops.get(dtype):
            return float(self.attention_flops[dtype])  # torch's SDPA, measured in that dtype
        if kernel == "auto" and self.attention_kernels:
            kernel = next(iter(self.attention_kernels))
        if kernel == "auto":
            if self.attention_flops.get(dtype):
                return float(self.attention_flops[dtype])
            return self.peak(dtype) * self.efficiency.get("attention", self.eff("matmul"))
        entry = self.attention_kernels.get(kernel)
        if entry is None:
            have = ", ".join(self.attention_kernels) or "none; use auto"
            raise SpecError(
                "attention_kernel",
                f"hardware {self.name} has no efficiency for attention_kernel {kernel!r} "
                f"(has: {have})",
            )
        achieved = self.peak(dtype) * entry[phase]
        half = entry.get("half_seq", 0)
        if phase == "backward":  # the backward kernels saturate at longer keys
            half = entry.get("backward_half_seq", half)
        if seq is None or not half:
            return achieved
        return achieved * np.asarray(seq, dtype=float) / (np.asarray(seq, dtype=float) + half)

    def eff(self, key: str) -> float:
        return float(self.efficiency.get(key, 1.0))

    def fused_launch_s(self) -> float:
        """Host seconds per fused-count kernel: ``launch_s``, else ``dispatch_s``."""
        return self.dispatch_s if self.launch_s is None else self.launch_s

    def gemm_tiling(self, dtype: str = "bf16") -> tuple[int, int, int]:
        """(SMs, tile rows, tile cols) for the GEMM quantization of ``dtype``'s Tensor Core
        GEMMs; (1, 1, 1), which charges nothing for whole-number shapes, where the profile
        gives no SM count, and for fp32 without TF32: those GEMMs run on the CUDA cores
        (SIMT SGEMM) with tiles of their own that ``gemm_tile`` does not describe (NVIDIA's
        guide measures the quantization of Tensor Core GEMMs). Single-A100 fp32 steps of
        350M-2.7B models were within 7 % unquantized and 25-45 % slow with the Tensor Core
        tile (issue 36, item 5)."""
        if not self.sm_count or dtype == "fp32":
            return 1, 1, 1
        return self.sm_count, int(self.gemm_tile[0]), int(self.gemm_tile[1])

    def intranode_link(self) -> str:
        """The name of the link inside a node: ``link_name``, else NVLink on a GPU, ICI on a
        TPU, memory on a CPU."""
        return self.link_name or {"gpu": "NVLink", "tpu": "ICI", "cpu": "memory"}[self.kind]

    def link_bandwidth(self) -> float:
        """One link as a ring collective sees it, bytes/s: one-way NVLink per GPU inside a
        node; on TPUs a link's bidirectional ICI bandwidth per mesh axis (Scaling Book
        ch. 3: a bidirectional ring moves data both ways at once)."""
        return self.link_bw_bidir if self.kind == "tpu" else self.link_bw

    def matmul_flops(self, dtype: str) -> float:
        """Achieved GEMM FLOP/s in ``dtype``: peak x ``efficiency.matmul_<dtype>`` where the
        profile measured that dtype apart (Hopper's fp8 GEMMs reach a smaller share of their
        peak than its bf16 ones), else x ``efficiency.matmul``."""
        return self.peak(dtype) * self.efficiency.get(f"matmul_{dtype}", self.eff("matmul"))

    def half_depth(self, dtype: str) -> float:
        """``gemm_half_depth`` of ``dtype`` (0: its GEMMs' efficiency does not fall with
        their depth)."""
        return float(self.gemm_half_depth.get(dtype, 0.0))

    def hbm_bandwidth(self) -> float:
        """Achieved device-memory bytes/s: hbm_bw x efficiency.hbm."""
        return self.hbm_bw * self.eff("hbm")

    def serve_flops(self, dtype: str) -> float:
        """FLOP/s a serving step's matmuls run at in ``dtype``: peak x efficiency.serve_matmul
        (fitted on published serving runs), else efficiency.matmul."""
        return self.peak(dtype) * self.efficiency.get("serve_matmul", self.eff("matmul"))

    def serve_grouped_flops(self, dtype: str, block_triton: bool = False) -> float:
        """FLOP/s a serving step's routed experts run at in ``dtype``: one grouped kernel per
        layer and projection (TensorRT-LLM's CUTLASS MoE GEMMs, vLLM's and SGLang's Triton
        ``fused_moe``), :meth:`serve_flops` x ``efficiency.serve_grouped`` (fitted on
        published serving runs; absent: the dense matmuls' rate). ``block_triton``: fp8
        weights scaled per 128 x 128 block in a Triton kernel, at ``efficiency.serve_block_fp8``
        of the 16-bit rate where the profile measures it (the fp8 rate otherwise)."""
        if block_triton and dtype == "fp8" and "serve_block_fp8" in self.efficiency:
            block = self.serve_flops("bf16") * self.eff("serve_block_fp8")
            return block * self.eff("serve_grouped")
        return self.serve_flops(dtype) * self.eff("serve_grouped")

    def decode_bandwidth(self) -> float:
        """Bytes/s a serving decode step reads its weights and cache at: hbm_bw x
        efficiency.decode (fitted on published serving runs), else efficiency.hbm."""
        return self.hbm_bw * self.efficiency.get("decode", self.eff("hbm"))
