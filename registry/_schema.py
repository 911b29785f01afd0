"""JSON Schema for a capability's parameters, shaped for agents.

Pydantic's schema is close to what an LLM tool-call wants, with three changes:
``title`` keys are stripped (they repeat the property name), every property
keeps its ``description``, and ``Optional[T]`` (``anyOf: [T, null]``) is
unwrapped to ``T`` so the schema says what to send rather than what may be null.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Return the agent-facing JSON Schema of ``model``."""
    raw = model.model_json_schema()
    cleaned = _clean(raw)
    assert isinstance(cleaned, dict)
    cleaned.setdefault("type", "object")
    cleaned.setdefault("properties", {})
    return cleaned


def _clean(node: Any) -> Any:
    if isinstance(node, list):
        return [_clean(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            # Keys of these maps are names, not keywords: a property called
            # "title" must survive.
            out[key] = {name: _clean(sub) for name, sub in value.items()}
        else:
            out[key] = _clean(value)
    return _unwrap_optional(out)


def _unwrap_optional(node: dict[str, Any]) -> dict[str, Any]:
    variants = node.get("anyOf")
    if not isinstance(variants, list):
        return node
    non_null = [v for v in variants if v != {"type": "null"}]
    if len(non_null) != 1 or len(non_null) == len(variants):
        return node
    merged = {k: v for k, v in node.items() if k != "anyOf"}
    inner = non_null[0]
    # Outer keywords (description, default) win over the inner schema's.
    return {**inner, **merged}
