"""The hardware profile a calibration writes: what was measured, each number with its origin.

Start: on a GPU the catalog has (``resolve_device`` of ``torch.cuda.get_device_name``), its
entry, for the datasheet peaks, the attention-kernel table and the GEMM tile; else an
empty profile whose peaks are the measured rates. Then, from the measurements:

- ``efficiency.matmul`` = the fitted C_eff (``fit.gemm_rate``, the device's training dtype:
  bf16 on GPUs, fp32 on CPUs) over that dtype's peak, and each other measured dtype's peak
  its C_eff over that efficiency (costmodel has one matmul efficiency, so peak x efficiency
  is then each dtype's measured rate); where the peaks are measured, each dtype's C_eff is
  its peak and the efficiency 1;
- ``hbm_bw`` the copy bandwidth (efficiency 1), ``dispatch_s`` the host seconds per kernel,
  ``attention_flops`` the causal SDPA rate per dtype (used where the profile has no kernel
  table), ``sm_count`` from the CUDA device;
- ``link_bw`` / ``link_latency_s`` the α-β fit over the collectives of the inside-node
  placements, ``network_bw`` / ``network_latency_s`` over the across-node ones
  (efficiencies 1: the rates are achieved ones). costmodel gives a link one α and one β;
  each op's own fit, send/recv's included, is in ``measured.links``; a cluster of one node
  borrows the link fit for the network and one rank per node the network fit for the
  link, and says so; a single rank (one GPU) measures no link and keeps its catalog
  entry's links, efficiencies and overlap, and says so;
- ``devices_per_node`` the ranks per node, ``hbm_bytes`` the device's memory (a CPU rank:
  its share of the machine's);
- ``overlap``: the share of the shorter of compute and communication that hides
  (``network.measure_overlap``).

``provenance`` records when, where and how (versions, command, node and rank counts);
``measured`` keeps every fit with its error, per placement and per op, for the reader.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from typing import Any

from costmodel.catalog.hardware import HARDWARE, resolve_device
from costmodel.specs.checks import SpecError
from validate.cluster import fit
from validate.cluster.topology import LINK, NETWORK, Topology

PEAK_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")


def _base(device_name: str, kind: str) -> tuple[dict[str, Any], str]:
    """(catalog entry or empty profile, where it came from)."""
    if kind == "gpu":
        try:
            name = resolve_device(device_name)
            entry = {k: v for k, v in HARDWARE[name].items() if k not in ("aliases", "calibration")}
            return entry, f"catalog entry {name} (datasheet peaks, attention kernels, GEMM tile)"
        except SpecError:
            pass
    return {"peak_flops": dict.fromkeys(PEAK_KEYS), "efficiency": {}}, "measured peaks"


def _by(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == kind]


def _gemm_fits(
    records: list[dict[str, Any]], tiling: tuple[int, int, int], hbm_bps: float
) -> dict[str, dict[str, Any]]:
    """One fitted rate per dtype, each over the tiles costmodel prices it with: fp32 (no
    TF32) runs on the CUDA cores, which ``Hardware.gemm_tiling`` charges no tiles."""
    rows = defaultdict(list)
    for r in _by(records, "gemm"):
        rows[r["dtype"]].append(r)
    size = {"fp32": 4, "bf16": 2, "fp16": 2}
    return {
        dt: fit.gemm_rate(rs, (1, 1, 1) if dt == "fp32" else tiling, hbm_bps, size[dt])
        for dt, rs in rows.items()
    }


def _link_fits(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One α-β fit per kind of link (the collectives of all its placements), and for the
    reader one per placement and one per placement and op (send/recv's included)."""
    rows = _by(records, "collective")
    out: dict[str, dict[str, Any]] = {}
    for link in (LINK, NETWORK):
        mine = [r for r in rows if r["link"] == link]
        each, places = defaultdict(list), defaultdict(list)
        for r in mine:
            each[f"{r['placement']}/{r['op']}"].append(r)
            if r["op"] != "send_recv":
                places[r["placement"]].append(r)
        collectives = [r for r in mine if r["op"] != "send_recv"]
        if collectives:
            out[link] = {
                **fit.alpha_beta(collectives),
                "by_placement": {k: fit.alpha_beta(v) for k, v in sorted(places.items())},
                "by_op": {k: fit.alpha_beta(v) for k, v in sorted(each.items())},
            }
    return out


def _links(
    fits: dict[str, dict[str, Any]], base: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The profile's link fields from the fits; with none (one rank), the catalog's kept."""
    link = fits.get(LINK) or fits.get(NETWORK)
    network = fits.get(NETWORK) or fits.get(LINK)
    if link is None or network is None:
        if "link_bw" not in base:
            raise ValueError("no collective was measured and no catalog entry has the links: "
                             "calibrate needs at least two ranks")  # fmt: skip
        return {}, ["one rank: links and overlap not measured, the catalog entry's kept"]
    notes = []
    if LINK not in fits:
        notes.append("one rank per node: link_bw is the across-node fit")
    if NETWORK not in fits:
        notes.append("one node: network_bw is the inside-node fit")
    return {
        "link_bw": link["beta_Bps"],
        "link_bw_bidir": 2 * link["beta_Bps"],
        "link_latency_s": link["alpha_s"],
        "network_bw": network["beta_Bps"],
        "network_latency_s": network["alpha_s"],
        "links_per_axis": 1,
    }, notes


def _rescale_ratios(eff: dict[str, float], catalog: dict[str, float], measured: set[str]) -> None:
    """Efficiencies the catalog (``hardware.json``) states relative to others: decode's
    share of a bandwidth whose copies reach ``hbm``, serving's GEMMs and a dtype's own GEMMs
    (``matmul_<dtype>``) as ratios to ``matmul``. Kept as those ratios on the measured
    profile, whose copy rate is its bandwidth (``hbm`` 1); a ``matmul_<dtype>`` of a dtype
    measured here is dropped, its peak carrying its measured rate."""
    if "decode" in eff:
        eff["decode"] = min(1.0, eff["decode"] / catalog.get("hbm", 1.0))
    scale = eff["matmul"] / catalog.get("matmul", 1.0)
    for key in [k for k in eff if k == "serve_matmul" or k.startswith("matmul_")]:
        if key.removeprefix("matmul_") in measured:
            del eff[key]
        else:
            eff[key] = min(1.0, eff[key] * scale)


def build(
    records: list[dict[str, Any]],
    topo: Topology,
    machine: dict[str, Any],
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """The profile (module docstring). ``machine``: ``kind`` (gpu/cpu), ``name``,
    ``memory_bytes`` per rank, ``sm_count``."""
    kind = machine["kind"]
    profile, origin = _base(machine["name"], kind)
    hbm = statistics.median(r["bytes"] / r["seconds"] for r in _by(records, "hbm"))
    sms = int(machine.get("sm_count") or 0)
    tile = profile.get("gemm_tile", (256, 128))
    tiling = (sms, int(tile[0]), int(tile[1])) if sms else (1, 1, 1)
    gemms = _gemm_fits(records, tiling, hbm)
    train_dtype = "bf16" if kind == "gpu" else "fp32"
    eff = dict(profile.get("efficiency") or {})
    if profile["peak_flops"].get(train_dtype):
        eff["matmul"] = min(1.0, gemms[train_dtype]["flops"] / profile["peak_flops"][train_dtype])
        # each other measured dtype: the peak that gives its measured rate at this efficiency
        # (on an H100 fp32 fits 0.70 of its datasheet peak where bf16 fits 0.63)
        profile["peak_flops"] = {
            **profile["peak_flops"],
            **{k: g["flops"] / eff["matmul"] for k, g in gemms.items() if k != train_dtype},
        }
    else:
        profile["peak_flops"] = {
            **profile["peak_flops"],
            **{k: g["flops"] for k, g in gemms.items()},
        }
        eff["matmul"] = 1.0
    _rescale_ratios(eff, profile.get("efficiency") or {}, set(gemms))
    attention = defaultdict(list)
    for r in _by(records, "attention"):
        attention[r["dtype"]].append(r["flops"] / r["seconds"])
    links, notes = _links(_link_fits(records), profile)
    overlap = _by(records, "overlap")
    profile.update(links)
    measured_links = {"link": 1.0, "network": 1.0} if links else {}
    profile.update(
        name=re.sub(
            r"[^A-Za-z0-9_.]+", "-", f"measured {machine['name']} {len(topo.nodes)}x{topo.per_node}"
        ).strip("-"),
        kind=kind,
        hbm_bytes=machine["memory_bytes"],
        hbm_bw=hbm,
        devices_per_node=topo.per_node,
        efficiency={**eff, "hbm": 1.0, **measured_links},
        attention_flops={k: statistics.median(v) for k, v in attention.items()},
        dispatch_s=statistics.median(r["seconds"] for r in _by(records, "dispatch")),
        overlap=overlap[-1]["hidden"] if overlap else profile.get("overlap", 1.0),
        source=f"validate.cluster calibrate on {len(topo.nodes)} node(s) x {topo.per_node} "
        f"rank(s) of {machine['name']}; started from {origin}",
        calibration={"basis": "measured", "summary": _summary(provenance, notes)},
        provenance=provenance,
        measured={"gemm": gemms, "links": _link_fits(records), "overlap": overlap, "notes": notes},
    )
    if sms:
        profile["sm_count"] = sms
    return profile


def _summary(provenance: dict[str, Any], notes: list[str]) -> str:
    extra = f" ({'; '.join(notes)})" if notes else ""
    return (
        f"measured on {provenance.get('nodes')} node(s) x {provenance.get('ranks_per_node')} "
        f"rank(s) on {provenance.get('date')} by {provenance.get('command')}{extra}"
    )
