"""``validate.cluster calibrate``: measure this cluster and write its hardware profile.

Order: the devices (GEMMs per dtype and shape, attention, memory bandwidth, host seconds
per kernel), then every placement's collectives and send/recv, then the overlap on the
largest placement; each measurement goes to ``OUT/measurements.jsonl`` as it finishes
(``validate.cluster.store``: ``--resume`` measures only what is missing), and rank 0 then
writes ``OUT/cluster-profile.json`` (``validate.cluster.profile``) and prints its numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from validate.cluster import device as dev
from validate.cluster import network, profile
from validate.cluster.store import MeasurementLog
from validate.cluster.topology import Topology
from validate.probes.cpu_env import active_allocator

PROFILE = "cluster-profile.json"


def ranks_on_host() -> int:
    """Ranks sharing this machine (two torchrun "nodes" on one host share its cores)."""
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts.count(socket.gethostname())


def machine(device: torch.device, sharing: int) -> dict[str, Any]:
    """What one rank computes on: name, kind, memory and SMs."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "kind": "gpu",
            "name": props.name,
            "memory_bytes": props.total_memory,
            "sm_count": props.multi_processor_count,
        }
    name = f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"kind": "cpu", "name": name, "memory_bytes": ram // sharing, "sm_count": 0}


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(topo: Topology, device: torch.device, argv: list[str]) -> dict[str, Any]:
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    cuda = device.type == "cuda"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "nodes": len(topo.nodes),
        "ranks_per_node": topo.per_node,
        "world": topo.world,
        "hosts": sorted(set(hosts)),
        "backend": dist.get_backend(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "driver": _driver() if cuda else None,
        "threads_per_rank": torch.get_num_threads(),
        "allocator": active_allocator(),
        "command": "python -m validate.cluster " + " ".join(argv),
    }


def calibrate(args: argparse.Namespace, device: torch.device, argv: list[str]) -> None:
    rank = dist.get_rank()
    topo = Topology.gather()
    about = machine(device, ranks_on_host())
    header = {
        "world": topo.world,
        "nodes": len(topo.nodes),
        "per_node": topo.per_node,
        "backend": dist.get_backend(),
        "device": about["name"],
        "quick": args.quick,
    }
    log = MeasurementLog(Path(args.out), header, args.resume, rank)
    dev.measure_gemms(log, device, args.quick)
    dev.measure_attention(log, device, args.quick)
    dev.measure_memory_and_host(log, device, args.quick)
    places = topo.placements(args.quick)
    for place in places:
        network.measure_placement(log, place, device, args.quick, args.reps)
    if places:  # one rank has no link to measure (profile.build keeps the catalog's)
        network.measure_overlap(log, places[-1], device, args.quick, args.reps)
    facts = provenance(topo, device, argv)
    if rank != 0:
        return
    result = profile.build(list(log.records.values()), topo, about, facts)
    path = Path(args.out) / PROFILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, path)
    print(summary(result, path))


def summary(result: dict[str, Any], path: Path) -> str:
    peaks = {k: f"{v:.3g}" for k, v in result["peak_flops"].items() if v}
    return (
        f"{path}: peak_flops {peaks}, matmul efficiency {result['efficiency']['matmul']:.2f}, "
        f"hbm {result['hbm_bw'] / 1e9:.1f} GB/s, link {result['link_bw'] / 1e9:.2f} GB/s "
        f"(alpha {result['link_latency_s'] * 1e6:.1f} us), network "
        f"{result['network_bw'] / 1e9:.2f} GB/s (alpha "
        f"{result['network_latency_s'] * 1e6:.1f} us), overlap {result['overlap']:.0%}, "
        f"dispatch {result['dispatch_s'] * 1e6:.1f} us/kernel"
    )
