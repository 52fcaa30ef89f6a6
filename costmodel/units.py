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
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "B" if not unit else "G"), (1e6, "M")):
        if abs(n) >= scale:
            short = f"{n / scale:,.2f} {suffix}{unit}"
            exact = f"{n:,.0f}" if float(n).is_integer() else f"{n:,.4g}"
            return f"{exact} ({short})"
    return f"{n:,.0f} {unit}".rstrip()
