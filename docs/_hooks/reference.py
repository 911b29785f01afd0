"""mkdocs hook: the API and configuration references, rendered from the code at build time.

A page holding ``<!-- capd:api -->`` gets every operator row (route, CLI, who may use it,
MCP tool, parameters with where each travels, type, default, limits); one holding
``<!-- capd:config -->`` gets every key of capd.toml with its type, default and meaning.
Both come from the models the daemon validates with, so they cannot drift from it.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from capd.sidecar._args import params_of
from capd.sidecar._table import COMMANDS
from capd.sidecar.server._config import CapdConfig

_LIMITS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "at least",
           "max_length": "at most"}


def _type(annotation: Any) -> str:
    """A type as a reader says it: ``int | None``, ``'live' | 'disabled'``, ``list of str``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`" for a in args)
    if origin in (list, tuple):
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"table of {_type(args[1])}"
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory else info.default  # type: ignore[call-arg]
    if isinstance(value, tuple):
        value = list(value)
    return "—" if value in (None, PydanticUndefined) else f"`{value!r}`"


def _limits(info: FieldInfo) -> str:
    said = [f"{_LIMITS[name]} {getattr(m, name)}" for m in info.metadata
            for name in _LIMITS if hasattr(m, name)]
    return ", ".join(said)


def api_reference() -> str:
    """Every operator row as a section: its route, CLI, roles, MCP tool and parameters."""
    out: list[str] = []
    for row in COMMANDS:
        tool = row.mcp or row.optional_mcp
        out += [f"### `capd {' '.join(row.cli)}`", "", row.summary, "",
                f"- HTTP: `{row.method} {row.path}`",
                f"- who: {', '.join(row.roles)}",
                f"- MCP tool: `{tool.name}`{'' if row.mcp else ' (if offered)'}" if tool
                else f"- MCP tool: none ({row.operator_only or row.cli_only})", ""]
        params = params_of(row.params)
        if params:
            out += ["| parameter | travels as | type | default | limits | meaning |",
                    "|---|---|---|---|---|---|"]
            for p in params:
                where = {"path": f"path `{{{p.key}}}`", "query": f"query `{p.key}`",
                         "header": f"header `{p.key}`", "local": "CLI only",
                         "body": "the JSON body" if p.key == "*" else f"body `{p.key}`"}
                flags = f" (`{p.arg.flags[0]}`)" if p.arg.flags else ""
                out.append(f"| `{p.name}`{flags} | {where[p.arg.at]} | {_type(p.info.annotation)}"
                           f" | {_default(p.info)} | {_limits(p.info)} |"
                           f" {p.info.description or ''} |")
            out.append("")
    return "\n".join(out)


def config_reference(model: type[BaseModel] = CapdConfig, table: str = "") -> str:
    """Every key of capd.toml; a table's keys under its own heading (``[mcp.http]``,
    ``[profiles.NAME]``, ``[[peers]]``)."""
    rows: list[str] = []
    nested: list[str] = []
    for name, info in model.model_fields.items():
        origin = typing.get_origin(info.annotation)
        inner = next((a for a in (info.annotation, *typing.get_args(info.annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
        dotted = f"{table.strip('[]')}.{name}" if table else name
        if inner is not None:
            nested.append(config_reference(inner, f"[{dotted}]" if origin is list else
                                           f"{dotted}.NAME" if origin is dict else dotted))
            if origin not in (list, dict):
                continue
        rows.append(f"| `{name}` | {_type(info.annotation)} | {_default(info)} | "
                    f"{_limits(info)} | {info.description or ''} |")
    head = [f"#### `[{table}]`" if table else "", "",
            "| key | type | default | limits | meaning |", "|---|---|---|---|---|"]
    return "\n".join([*(head if rows else []), *rows, "", *nested])


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Fill a page's reference markers."""
    if "<!-- capd:api -->" in markdown:
        markdown = markdown.replace("<!-- capd:api -->", api_reference())
    if "<!-- capd:config -->" in markdown:
        markdown = markdown.replace("<!-- capd:config -->", config_reference())
    return markdown
