"""What ``serve`` answers: its numbers by dotted name with notes, and how many sequences
fit, in the words the CLI, the app, :class:`costmodel.answers.serve.ServeAnswer` and this
result's repr share."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.specs.checks import Quantities, UnknownKey, unknown


@dataclass(repr=False)
class ServeEstimate(Mapping):
    """Numbers by dotted name (bytes, seconds, FLOPs, tokens/s) and notes; read-only and
    dict-like (``est["time_s.tpot"]``, ``"fits" in est``, ``dict(est)``)."""

    values: dict[str, Any]
    """Every number by dotted name (a ``Quantities``: ``values()`` works as a dict's)."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.values, Quantities):
            self.values = Quantities(self.values)

    def __getitem__(self, key: str) -> Any:
        try:
            return self.values[key]
        except (KeyError, TypeError):  # TypeError: an unhashable key
            raise UnknownKey(
                key, unknown("quantity", key, self.values, "keys() lists them")
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        v = self.values
        if not v.get("fits"):  # no times for a load that does not fit (the CLI's words)
            said = how_many(v.get("max_batch", 0), room=v.get("memory_bytes_per_device.kv_room"))
            return f"ServeEstimate(does NOT fit: {said}; {len(v)} quantities)"
        head = [f"fits ({how_many(v['max_batch'])})"]
        shown = (("time_s.ttft", "TTFT", 1e3, " ms"), ("time_s.tpot", "TPOT", 1e3, " ms"),
                 ("throughput.output_tokens_per_s", "tokens/s", 1, ""))  # fmt: skip
        for key, label, scale, unit in shown:
            if key in v:
                head.append(f"{label} {v[key] * scale:,.4g}{unit}")
        return f"ServeEstimate({', '.join(head)}; {len(v)} quantities)"


def how_many(most: int, replicas: int = 1, room: float | None = None) -> str:
    """How many sequences fit a replica, in words (none: not even one's cache, or where the
    cache's ``room`` is negative the weights alone do not fit), and over the ``replicas``
    where there are several: the verdict's count, the CLI's, the app's and
    :class:`ServeAnswer`'s repr."""
    if most < 1 and room is not None and room < 0:
        return "the weights alone do not fit the engine's share of a device (a larger tp)"
    if most < 1 and room is not None:  # the weights fit: what they leave is too little
        return (f"the weights leave {room / 2**30:,.2f} GiB of the engine's share for the "
                "cache, less than one sequence's")  # fmt: skip
    if most < 1:
        return "not one sequence's cache fits beside the weights"
    said = f"up to {most:,} sequence{'s' * (most != 1)} fit"
    if replicas > 1:
        said += f" a replica ({most * replicas:,} over the {replicas} replicas)"
    return said
