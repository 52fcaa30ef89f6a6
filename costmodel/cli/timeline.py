"""A step timeline as a self-contained SVG (or an HTML page holding it): no scripts, no CDN."""

from __future__ import annotations

from html import escape
from pathlib import Path

from costmodel.engine.estimate import estimate
from costmodel.engine.timeline import COLOURS, LANES, LEGEND, Segment, segments
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec

WIDTH, LEFT, LANE_H, TOP = 960, 210, 34, 48


def _ticks(end: float) -> list[float]:
    raw = end / 6
    step = next(s * 10**e for e in range(-6, 4) for s in (1, 2, 5) if s * 10**e >= raw)
    return [i * step for i in range(int(end / step) + 1)]


def svg(segs: list[Segment], title: str) -> str:
    """Lanes top to bottom, time left to right; every bar has a tooltip with its seconds."""
    end = max((s.end for s in segs), default=0.0) or 1.0
    scale = (WIDTH - LEFT - 20) / end
    height = TOP + LANE_H * len(LANES) + 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i, lane in enumerate(LANES):
        y = TOP + i * LANE_H
        parts.append(f'<text x="10" y="{y + 21}">{escape(lane)}</text>')
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y + LANE_H}" '
                     f'y2="{y + LANE_H}" stroke="#ddd"/>')  # fmt: skip
    for s in segs:
        y = TOP + LANES.index(s.lane) * LANE_H + 4
        x, w = LEFT + s.start * scale, max(s.seconds * scale, 0.5)
        tip = f"{s.label}: {s.seconds * 1e3:,.2f} ms (from {s.start * 1e3:,.2f} ms)"
        parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{LANE_H - 8}" '
                     f'fill="{COLOURS[s.kind]}"><title>{escape(tip)}</title></rect>')  # fmt: skip
        if w > 7 * len(s.label):
            parts.append(f'<text x="{x + 4:.2f}" y="{y + 17}" fill="white">'
                         f"{escape(s.label)}</text>")  # fmt: skip
    axis_y = TOP + LANE_H * len(LANES) + 16
    for t in _ticks(end):
        x = LEFT + t * scale
        parts.append(f'<text x="{x:.2f}" y="{axis_y}" text-anchor="middle">{t:g} s</text>')
    legend_y = axis_y + 24
    for i, (kind, colour) in enumerate(COLOURS.items()):
        x = LEFT + i * 140
        parts.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{x + 16}" y="{legend_y}">{LEGEND[kind]}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def timeline_path(path: str) -> Path:
    """The output path, refused unless it ends in .svg or .html."""
    out = Path(path)
    if out.suffix.lower() not in (".svg", ".html"):
        raise SpecError("timeline", f"timeline must end in .svg or .html (got {path!r})")
    return out


def write_timeline(
    path: str, model: ModelSpec, train: TrainSpec, parallel: ParallelSpec, hw: Hardware
) -> Path:
    """Estimate one layout and write its timeline as ``.svg`` or ``.html``."""
    out = timeline_path(path)
    values = estimate(model, train, parallel, hw).values
    segs = segments(values, parallel)
    title = (f"{model.name}, {parallel.devices} x {hw.name}: one step "
             f"{values['time_s.step']:.3f} s")  # fmt: skip
    text = svg(segs, title)
    if out.suffix.lower() == ".html":
        text = (f"<!doctype html><meta charset='utf-8'><title>{escape(title)}</title>"
                f"<body>{text}</body>")  # fmt: skip
    try:
        out.write_text(text)
    except OSError as err:
        raise SpecError("timeline", f"cannot write {path}: {err.strerror}") from None
    return out
