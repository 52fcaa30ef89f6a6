"""A plan row in words: its layout on one line and what limits it (the CLI's table, the
app's, the verdict's ``limited by``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.specs.frameworks import trait


def layout_label(row: dict[str, Any]) -> str:
    """A layout in one line, e.g. ``fsdp2 dp2 fsdp64 tp2+sp pp1 cp4 mb1 ga8 none``."""
    sp = "+sp" if row["sequence_parallel"] else ""
    v = f" v{row['pp_interleave']}" if row["pp_interleave"] > 1 else ""
    zero = f" zero{row['zero']}" if trait(row["framework"], "zero_stages") else ""
    ep = f" ep{row['ep']}" if row.get("ep", 1) > 1 else ""
    kind = row.get("ep_dispatcher", "all-to-all")
    ep += f"+{kind}" if ep and kind != "all-to-all" else ""
    ep += "+a2a-overlap" if row.get("ep_overlap") else ""
    ep += f" etp{row['etp']}" if row.get("etp", row["tp"]) != row["tp"] else ""
    return (f"{row['framework']}{zero} dp{row['dp']} fsdp{row['fsdp']} tp{row['tp']}{sp} "
            f"pp{row['pp']}{v} cp{row['cp']}{ep} mb{row['micro_batch']} "
            f"ga{row['grad_accum']} {row['recompute']}")  # fmt: skip


def limit_of(row: dict[str, Any], budget: float, capacity: float = np.inf) -> str:
    """What binds a layout: the largest of the pipeline bubble, exposed TP communication,
    the expert-parallel all-to-alls (exposed too), the host's kernel launches where the
    device waits for them (``costmodel.parallel.host``: beyond its own time, and at MoE
    layers' host syncs), the compute lost to the communication overlapped with it
    (contention, ``costmodel.parallel.timing.contention``), the rest of the communication
    beyond the compute it overlaps (named after the largest of the FSDP, DP, CP and PP
    groups' traffic), and the optimizer step, when it exceeds 5 % of the step (named after
    compute where the device's own compute, its waits for the host left out, is half the
    step or more and the part less); else compute.
    Memory above 90 % of the budget is named too (a layout that shards less would not
    fit), and reserved bytes over the device's ``capacity`` (a risk of running out)."""
    step = row["time_s.step"]
    tp = (row["comm_time_s.tp"] - row.get("comm_overlapped_s.tp", 0.0)) * row.get(
        "comm_exposed_share.tp", 1.0
    )
    ep = row.get("comm_time_s.ep", 0.0) * row.get("comm_exposed_share.ep", 1.0)
    lost = row.get("time_s.contention_forward", 0.0) + row.get("time_s.contention_backward", 0.0)
    phases = row["time_s.forward"] + row["time_s.backward"]
    groups = {"FSDP": "comm_time_s.fsdp", "DP": "comm_time_s.dp", "CP": "comm_time_s.cp",
              "PP": "comm_time_s.pp"}  # fmt: skip
    rest = max(groups, key=lambda g: row.get(groups[g], 0.0))
    parts = {
        "pipeline bubble": row["time_s.bubble"],
        "TP communication": tp,
        "expert all-to-all": ep,
        "host kernel launches": row.get("time_s.host_bound", 0.0),
        "contention with the overlapped communication": lost,
        f"{rest} communication": max(0.0, phases - row["time_s.compute"] - tp - ep - lost),
        "optimizer step": row["time_s.optimizer"],
    }
    name, worst = max(parts.items(), key=lambda kv: kv[1])
    text = "compute"
    device = row["time_s.compute"] - row.get("time_s.host_bound", 0.0)  # not its host waits
    if 0.05 * step < worst < 0.5 * step <= device:  # compute still leads
        exposed = ", exposed" * (name in ("TP communication", "expert all-to-all",
                                          f"{rest} communication"))  # fmt: skip
        text = f"compute; {name} {worst / step:.0%} of the step{exposed}"
    elif worst > 0.05 * step:
        text = f"{name} ({worst / step:.0%} of the step)"
    used = row["memory_bytes_per_device.peak"] / budget
    text = f"{text}; memory {used:.0%} of budget" if used > 0.9 else text
    reserved = row.get("memory_bytes_per_device.reserved", 0.0)
    if reserved > capacity:
        text += f"; reserved {reserved / 2**30:,.1f} GiB over the device's {capacity / 2**30:,.0f}"
    return text
