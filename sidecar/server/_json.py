"""JSON for the socket API: encoding that never fails quietly, and a nesting limit."""

from __future__ import annotations

import json
from typing import Any

import orjson

MAX_JSON_DEPTH = 64


def _fallback(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


class Unencodable(ValueError):
    """A value that cannot be written as JSON at all (circular, or nested past any limit)."""


def dumps(body: Any) -> bytes:
    """JSON bytes; values JSON cannot hold (a Path, a set, a model) become strings or lists.

    What orjson refuses (an integer past 64 bits, nesting past 255 levels) is
    written by the json module instead. Raises :class:`Unencodable` when
    neither can write it.
    """
    try:
        return orjson.dumps(body, default=_fallback)
    except TypeError:
        pass
    try:
        return json.dumps(body, default=_fallback, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError, RecursionError) as exc:
        raise Unencodable(f"{type(exc).__name__}: {exc}") from exc


def json_depth_exceeds(raw: bytes, value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the parsed JSON ``value`` (from ``raw``) nests deeper than ``limit``."""
    if raw.count(b"[") + raw.count(b"{") <= limit:  # cannot be deeper: skip the walk
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return False
