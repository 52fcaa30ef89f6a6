"""Display formatting. Values stay in SI base units (bytes, FLOPs, seconds) until shown."""

from __future__ import annotations

GIB = 2**30
GB = 10**9


def fmt_bytes(n: float) -> str:
    """``12.35 GiB (13.26 GB)``: binary and decimal side by side, since both get quoted."""
    if abs(n) < 2**20:
        return f"{n:,.0f} B"
    if abs(n) < GIB:
        return f"{n / 2**20:,.2f} MiB ({n / 10**6:,.2f} MB)"
    return f"{n / GIB:,.2f} GiB ({n / GB:,.2f} GB)"


def fmt_count(n: float, unit: str = "") -> str:
    """``3,406,809,600 (3.41 B)``; exact digits first, then a readable scale."""
    scales = ((1e21, "Z"), (1e18, "E")) if unit else ()  # a count of things stops at P
    for scale, suffix in (*scales, (1e15, "P"), (1e12, "T"), (1e9, "B" if not unit else "G"),
                          (1e6, "M")):  # fmt: skip
        if abs(n) >= scale:
            short = f"{n / scale:,.2f} {suffix}{unit}"
            exact = f"{n:,.0f}"  # a million or more: whole digits (1e+12 read as code)
            return f"{exact} ({short})"
    return f"{n:,.0f} {unit}".rstrip()


def fmt_rate(x: float) -> str:
    """A rate as a reader writes it: whole digits from 10 (4,470 tokens/s, 1,000
    requests/s), else the digits that say it (4.59, a CPU's 0.34); never 1e+03."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.3g}"


def fmt_seconds(s: float) -> str:
    """``850 µs``, ``12.3 ms``, ``4.56 s``, ``2.5 h``: three significant digits."""
    for scale, unit in ((3600, "h"), (1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(s) >= scale:
            return f"{s / scale:,.3g} {unit}"
    return f"{s * 1e9:,.3g} ns" if s else "0 s"


def fmt_quantity(key: str, value: float) -> str:
    """A quantity in the unit its key names: bytes as GiB (GB), seconds, FLOPs with a scale,
    fractions such as MFU as percent; anything else with six significant digits."""
    parts = key.split(".")
    head = parts[0]
    if "bytes" in head:
        return fmt_bytes(value)
    if head in ("time_s", "comm_time_s", "comm_phase_s") or parts[-1] == "time_s":
        return fmt_seconds(value)
    if head == "tokens_per_s":
        return f"{value:,.0f}"
    if head == "flops":
        return fmt_count(value, "FLOP")
    if head == "params":
        return fmt_count(value)
    if head in ("mfu", "hfu"):
        return f"{100 * value:.1f} %"
    if head == "train_cost":
        return f"${value:,.0f}"
    return f"{value:,.6g}"


def plural(n: int, noun: str) -> str:
    """``1 device``, ``8 devices``: a count with its noun, plural but for one."""
    return f"{n:,} {noun}{'s' * (n != 1)}"
