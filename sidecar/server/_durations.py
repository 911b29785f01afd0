"""Durations as an operator writes them: ``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w``."""

from __future__ import annotations

from .._errors import BadRequest

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """``90``, ``45s``, ``30m``, ``12h``, ``7d``, ``2w`` as seconds; raise :class:`BadRequest`."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:])
    number = value[:-1] if unit is not None else value
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError as exc:
        raise BadRequest(f"{text!r} is not a duration; use e.g. 90, 45s, 30m, 12h or 7d") from exc
    if seconds < 0:
        raise BadRequest(f"duration {text!r} is negative")
    return seconds
