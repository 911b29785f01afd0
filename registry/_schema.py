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


def undescribed_parameters(schema: dict[str, Any]) -> list[str]:
    """The dotted paths of the properties in ``schema`` that carry no ``description``
    (the tool-spec convention: every property has one), nested objects and array items
    included; ``$ref``s are followed within the schema's own ``$defs``."""
    defs = {**schema.get("$defs", {}), **schema.get("definitions", {})}
    missing: list[str] = []

    def target(node: dict[str, Any]) -> Any:
        """The schema in ``defs`` that ``node``'s ``$ref`` names, or None."""
        ref = node.get("$ref")
        return defs.get(ref.rsplit("/", 1)[-1]) if isinstance(ref, str) else None

    def visit(node: Any, path: str, depth: int) -> None:
        if not isinstance(node, dict) or depth > 16:
            return
        if target(node) is not None:
            node = {**target(node), **{k: v for k, v in node.items() if k != "$ref"}}
        for name, child in (node.get("properties") or {}).items():
            where = f"{path}.{name}" if path else name
            if isinstance(child, dict) and not (
                    child.get("description") or (target(child) or {}).get("description")):
                missing.append(where)
            visit(child, where, depth + 1)
        items = node.get("items")
        if isinstance(items, dict):
            visit(items, f"{path}[]", depth + 1)
        for key in ("anyOf", "oneOf", "allOf"):
            for option in node.get(key) or ():
                visit(option, path, depth + 1)

    visit(schema, "", 0)
    return sorted(set(missing))
