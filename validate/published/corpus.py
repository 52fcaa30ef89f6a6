"""Published training runs as costmodel specs, and what each run measured, per GPU.

``data/runs.json`` is a copy of ``shared/published-runs/runs.json`` (66 runs, 6 sources;
fields and conventions in that folder's README). :func:`case_of` maps one run to a
ModelSpec, TrainSpec, ParallelSpec and Hardware, and its measurement to tokens/s per GPU
and memory per GPU (bytes). What a run leaves unstated is filled by a rule per source that
cites where the value comes from (never a number fitted to the run) and is listed in the
case's ``assumptions``. Torch-free.

Converting a quoted TFLOP/s or MFU back to tokens/s uses the source's own FLOP formula
(the README's first convention):

- Megatron-Core (``megatron-lm``) and Korthikanti et al. 2022 (``megatron-lm-2022``): model
  FLOPs per sequence ``12·s·l·h²·((1 + g/a + s/h)·q/h + gate·F/h + V/(2·l·h))``
  (``num_floating_point_operations``, megatron/training/training.py, 2024; equal to
  ``72·s·l·h²·(1 + s/(6h) + V/(12·l·h))`` for GPT; Korthikanti et al. 2022, Sec. 6.3).
- Narayanan et al. 2021, Sec. 5.1 (``megatron-lm-2021``): ``96·s·l·h²·(1 + s/(6h) +
  V/(16·l·h))``, which counts the recomputed forward.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from costmodel import Hardware, ModelSpec, ParallelSpec, TrainSpec, get_hardware, get_model

GiB = 2**30
PEAK_BF16 = {"a100": 312e12, "h100": 989.4e12}
"""The peak the sources divide by for MFU (A100 and H100 SXM dense bf16/fp16)."""


class CorpusError(ValueError):
    """A run that cannot be mapped: the message says which field and why."""


@dataclass(frozen=True)
class Case:
    """One published run as specs, with its measurement per GPU."""

    id: str
    group: str
    model: ModelSpec
    train: TrainSpec
    parallel: ParallelSpec
    hardware: Hardware
    measured: dict[str, float]
    """``tokens_per_s_per_gpu`` and, where reported, ``memory_bytes_per_gpu``."""
    assumptions: tuple[str, ...] = field(default=())
    source: str = ""

    @property
    def n_gpus(self) -> int:
        return self.parallel.devices


def default_runs_path() -> Path:
    return Path(str(resources.files("validate.published").joinpath("data/runs.json")))


def load_runs(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The runs of a corpus file (``{"runs": [...]}`` or a list)."""
    try:
        data = json.loads(Path(path or default_runs_path()).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CorpusError(f"runs: cannot read {path}: {err}") from err
    runs = data["runs"] if isinstance(data, dict) else data
    if not isinstance(runs, list):
        raise CorpusError("runs: expected a list of runs or an object with 'runs'")
    return runs


def corpus_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every published-runs command takes: ``--runs FILE`` and ``--out DIR``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--runs", help="corpus JSON (default: the packaged copy of "
                        "shared/published-runs/runs.json)")  # fmt: skip
    parser.add_argument("--out", default="published-results", help="output folder")
    return parser


def open_corpus(args: argparse.Namespace) -> tuple[list[dict[str, Any]], Path]:
    """The runs of ``--runs`` and the ``--out`` folder, created (CorpusError if either fails)."""
    runs = load_runs(args.runs)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CorpusError(f"out: cannot create {out}: {err.strerror or err}") from None
    return runs, out


# Korthikanti et al. 2022, Table 3 (values recalled from the paper; the corpus notes that
# its stored text lacks them): hidden, layers, heads, TP, PP, global batch; micro-batch 1.
_KORTHIKANTI = {
    "22B": (6144, 48, 64, 8, 1, 4),
    "175B": (12288, 96, 96, 8, 8, 64),
    "530B": (20480, 105, 128, 8, 35, 280),
    "1T": (25600, 128, 160, 8, 64, 512),
}


def case_of(run: dict[str, Any]) -> Case:
    """The specs of one run and its measurement per GPU (CorpusError if unmappable)."""
    notes: list[str] = []
    run = _fill_unstated(run, notes)
    model = _model(run, notes)
    train, parallel = _layout(run, model, notes)
    hardware = _hardware(run, notes)
    measured = _measured(run, model, train, parallel, notes)
    src = run.get("source", {})
    source = " ".join(str(src.get(k)) for k in ("repo", "path", "table") if src.get(k))
    return Case(
        id=run["id"],
        group=run["group"],
        model=model,
        train=train,
        parallel=parallel,
        hardware=hardware,
        measured=measured,
        assumptions=tuple(notes),
        source=source,
    )


def _fill_unstated(run: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Sizes a source leaves out, from the paper the run comes from."""
    run = json.loads(json.dumps(run))  # a deep copy
    if run["group"] == "megatron-lm-2022":
        size = run["id"].split("-")[2]
        h, layers, heads, tp, pp, batch = _KORTHIKANTI[size]
        m = run["model"]
        m.setdefault("d_model", h)
        m.setdefault("n_layers", layers)
        m.setdefault("n_heads", heads)
        m.setdefault("d_ff", 4 * m["d_model"])
        par = run["parallelism"]
        dp = par.get("dp") or 1
        run["n_gpus"] = run.get("n_gpus") or dp * tp * pp
        run["global_batch"] = run.get("global_batch") or batch * dp
        run["micro_batch"] = run.get("micro_batch") or 1
        notes.append(
            f"Korthikanti et al. 2022 Table 3: h={h}, l={layers}, a={heads}, tp={tp}, "
            f"pp={pp}, batch {batch} per replica, micro-batch 1"
        )
    if run.get("micro_batch") is None:
        local = run.get("local_batch_per_dp_rank")
        pp = run["parallelism"].get("pp") or 1
        if run["group"] == "torchtitan" and pp > 1:
            # torchtitan's pipeline default: as many micro-batches as stages
            dp_ranks = run["n_gpus"] // (run["parallelism"]["tp"] * pp * run["parallelism"]["cp"])
            local = local or run["global_batch"] // dp_ranks
            run["micro_batch"] = max(local // pp, 1)
            notes.append(f"micro-batch {run['micro_batch']}: local batch {local} over {pp} stages")
        else:
            run["micro_batch"] = 1
            notes.append("micro-batch 1 (Megatron-LM's example scripts for GPT at scale)")
    return run


def _model(run: dict[str, Any], notes: list[str]) -> ModelSpec:
    m = run["model"]
    if m.get("preset"):  # an architecture costmodel ships (from its config.json)
        notes.append(f"architecture: costmodel's {m['preset']} preset")
        return get_model(m["preset"])
    ffn_text = str(m.get("ffn", "gelu")).lower()
    llama = "swiglu" in ffn_text
    mpt = run["group"] == "mosaicml"
    gpt = not llama and not mpt
    kwargs = {
        "name": m.get("name", run["id"]),
        "vocab": m["vocab"],
        "d_model": m["d_model"],
        "n_layers": m["n_layers"],
        "n_heads": m["n_heads"],
        "n_kv_heads": m.get("n_kv_heads") or m["n_heads"],
        "d_ff": m.get("d_ff") or 4 * m["d_model"],
        "ffn": "swiglu" if llama else "gelu",
        "norm": "rmsnorm" if llama else "layernorm",
        "bias": gpt,
        "tied": not llama,
        "pos": "learned" if gpt else "rope",
        "max_positions": m["seq"],
    }
    if mpt:
        notes.append("MPT: ALiBi (no position parameters), no biases, tied embeddings")
    return ModelSpec(**kwargs)


_RECOMPUTE = (("full", "full"), ("selective", "selective"))
_PRECISION = (("fp8", "fp8"), ("fp16", "fp16-mixed"))


def _by_prefix(text: str, table: tuple[tuple[str, str], ...], default: str) -> str:
    """The value of the first prefix the source's wording starts with."""
    text = text.lower()
    return next((value for prefix, value in table if text.startswith(prefix)), default)


def _layout(
    run: dict[str, Any], model: ModelSpec, notes: list[str]
) -> tuple[TrainSpec, ParallelSpec]:
    par = run["parallelism"]
    tp, pp, cp = par.get("tp") or 1, par.get("pp") or 1, par.get("cp") or 1
    fsdp = par.get("fsdp") or 1
    n = run["n_gpus"]
    if n % (tp * pp * cp * fsdp):
        raise CorpusError(f"{run['id']}: n_gpus={n} is not a multiple of fsdp*tp*pp*cp")
    dp = n // (tp * pp * cp * fsdp)
    if par.get("dp") not in (None, dp):
        raise CorpusError(f"{run['id']}: parallelism.dp={par['dp']} but n_gpus gives {dp}")
    micro, batch = run["micro_batch"], run["global_batch"]
    replicas = dp * fsdp
    if batch % (micro * replicas):
        raise CorpusError(f"{run['id']}: global_batch={batch} not a multiple of micro*dp*fsdp")
    recompute = _by_prefix(run.get("activation_recompute", ""), _RECOMPUTE, "none")
    if run.get("activation_recompute") == "not stated":
        notes.append("recomputation not stated: none (Megatron-Core's default)")
    if recompute == "selective" and run["group"] == "torchtitan":
        recompute = "selective-op"
        notes.append('torchtitan selective AC: op-level (toml default selective_ac_option="op")')
    elif "every n blocks" in run.get("activation_recompute", ""):
        notes.append("selective every n blocks, n unstated: costed as the attention core's")
    # the framework a run states (NeMo runs Megatron-Core), else its source's
    framework = run.get("framework") or (
        "megatron" if run["group"].startswith("megatron") else "fsdp2"
    )
    compiled = run.get("torch_compile")
    if compiled is None:  # Megatron ships fused kernels; the others ran eager PyTorch
        compiled = run["group"].startswith("megatron")
        notes.append(f"torch.compile not stated: {'fused' if compiled else 'eager'} kernels")
    old_megatron = run["group"] in ("megatron-lm-2021", "megatron-lm-2022")
    kernel = run.get("attention_kernel", "auto")  # where the source states it
    if run["group"] == "mosaicml":  # submit_benchmarks.py: --attn_impl triton (its default)
        kernel = "triton-2022"
        notes.append("attention: the 2022 Triton FlashAttention (attn_impl: triton)")
    if run["group"].startswith("megatron"):
        notes.append("dropout 0.1 (Megatron's --hidden-dropout/--attention-dropout defaults)")
    train = TrainSpec(
        batch=batch,
        seq=run["model"]["seq"],
        precision=_by_prefix(run.get("precision", "bf16"), _PRECISION, "bf16-mixed"),
        optimizer="adamw",
        optimizer_impl="fused" if framework == "megatron" else "foreach",
        attention="naive" if old_megatron else "flash",
        attention_kernel=kernel,
        elementwise="fused" if compiled else "eager",
        dropout=0.1 if run["group"].startswith("megatron") else 0.0,
        recompute=recompute,
        grad_accum=batch // (micro * replicas),
    )
    vpp = par.get("vpp") or 1
    if "interleaved" in run["id"]:
        vpp = 2
        notes.append("interleaved 1F1B with 2 virtual stages per rank (not stated)")
    if run["group"] in ("mosaicml", "ibm-pytorch"):
        notes.append("FSDP1 with a bf16 MixedPrecision policy: held as FSDP2 holds it")
    parallel = ParallelSpec(
        framework=framework,
        grad_reduce_fp32=run["group"] == "torchtitan",
        async_tp=_async_tp(run, tp, notes),
        dp=dp,
        fsdp=fsdp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=par.get("ep") or 1,
        pp_interleave=vpp,
        sequence_parallel=tp > 1 and run["group"] != "megatron-lm-2021",
    )
    parallel.check(model, train)
    return train, parallel


def _async_tp(run: dict[str, Any], tp: int, notes: list[str]) -> bool:
    """Tensor-parallel collectives overlapped with their matmuls, where the source says so:
    torchtitan's async TP rows, and Megatron-Core r0.8's "overlap of DP/TP/PP comm"
    (Transformer Engine's --tp-comm-overlap)."""
    if "asynctp" in str(run.get("precision", "")).lower().replace(" ", "") + run["id"]:
        return True
    stated = re.search(r"overlap of ([\w/]+) comm", run.get("notes", ""))
    if tp > 1 and stated and "TP" in stated.group(1).split("/"):
        notes.append(f"TP communication overlapped (source: {stated.group(0)!r})")
        return True
    return False


def _hardware(run: dict[str, Any], notes: list[str]) -> Hardware:
    """The catalog device a run names, with the inter-node line rate its source states
    per node ("A100 80GB, 400Gbps", or its table's "1600Gbps RoCE") in place of the
    catalog's (a DGX's NICs)."""
    text = f"{run['hardware']} {run.get('source', {}).get('table', '')}".lower()
    hw = _device(run, text)
    stated = re.search(r"(\d+)\s*gbps", text)
    if stated:
        per_gpu = int(stated.group(1)) * 1e9 / 8 / hw.devices_per_node
        if per_gpu != hw.network_bw:
            notes.append(f"network {stated.group(1)} Gb/s per node as stated: "
                         f"{per_gpu / 1e9:g} GB/s per GPU")  # fmt: skip
            hw = dataclasses.replace(hw, network_bw=per_gpu)
    return hw


def _device(run: dict[str, Any], text: str) -> Hardware:
    for name in ("gb200", "b200"):
        if name in text:
            return get_hardware(name)
    if "96gb" in text:
        return get_hardware("h100-sxm-96gb")
    if "h100" in text:
        return get_hardware("h100-sxm")
    if "40gb" in text:
        return get_hardware("a100-40gb")
    if "a100" in text:
        return get_hardware("a100-80gb")
    raise CorpusError(f"{run['id']}: no catalog device for hardware {run['hardware']!r}")


def source_flops_per_sequence(group: str, model: ModelSpec, seq: int) -> float:
    """FLOPs the source counts per sequence per step (see the module docstring)."""
    s, h, L, V = seq, model.d_model, model.n_layers, model.vocab
    if group == "megatron-lm-2021":
        return 96 * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    q = model.n_heads * model.head_dim / h
    gate = 1.5 if model.ffn == "swiglu" else 1.0
    attn = (1 + model.n_kv_heads / model.n_heads + s / h) * q
    return 12 * s * L * h**2 * (attn + gate * model.d_ff / h + V / (2 * L * h))


def _measured(
    run: dict[str, Any], model: ModelSpec, train: TrainSpec, par: ParallelSpec, notes: list[str]
) -> dict[str, float]:
    got = run["measured"]
    out: dict[str, float] = {}
    if "tokens_per_s_per_gpu" in got:
        out["tokens_per_s_per_gpu"] = float(got["tokens_per_s_per_gpu"])
    else:
        tflops = got.get("tflops_per_gpu")
        if tflops is None:
            peak = PEAK_BF16["h100" if "h100" in run["hardware"].lower() else "a100"]
            tflops = got["mfu"] * peak / 1e12
            notes.append(f"tokens/s from MFU {got['mfu']} x {peak / 1e12:.0f} TFLOP/s")
        per_seq = source_flops_per_sequence(run["group"], model, train.seq)
        out["tokens_per_s_per_gpu"] = tflops * 1e12 / per_seq * train.seq
    if "memory_GiB" in got:
        out["memory_bytes_per_gpu"] = float(got["memory_GiB"]) * GiB
    return out
