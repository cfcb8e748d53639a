"""How the pages write figures: durations, rates, sizes, and the overview's trend lines.

Pure functions of numbers, so the templates stay free of arithmetic and the
rules are tested on their own. A figure that is unknown is shown as a dash,
never as a zero that would read as a fact.
"""

from __future__ import annotations

from collections.abc import Sequence

DASH = "–"


def duration(seconds: float | None) -> str:
    """``850 ms``, ``12.4 s``, ``3 min 5 s``, ``2 h 10 min``; a dash when unknown."""
    if seconds is None or seconds < 0:
        return DASH
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def count(value: float | None) -> str:
    """``12``, ``3.4 k``, ``1.2 M``; a dash when unknown (negative)."""
    if value is None or value < 0:
        return DASH
    for size, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def size(value: float | None) -> str:
    """Bytes as ``512 B``, ``3.1 MiB``; a dash when unknown (negative)."""
    if value is None or value < 0:
        return DASH
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= factor:
            return f"{value / factor:.1f} {unit}"
    return f"{value:.0f} B"


def sparkline(values: Sequence[float | None], width: int = 120, height: int = 24) -> str:
    """An SVG polyline's ``points`` for ``values`` (oldest first), scaled to the box.

    Unknown values are left out, so a gap does not draw as a drop to zero; fewer
    than two known values draw nothing.
    """
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(known) < 2:
        return ""
    top = max(v for _, v in known)
    bottom = min(0.0, min(v for _, v in known))
    span = (top - bottom) or 1.0
    step = width / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - (v - bottom) / span * (height - 2) - 1:.1f}" for i, v in known
    )
