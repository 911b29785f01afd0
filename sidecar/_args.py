"""A row's parameters: one frozen pydantic model whose fields say where each value travels.

The model is the one place a parameter is written: its type, default and limits, its help.
From it come the MCP tool's input schema (:func:`input_schema`), the CLI's flags
(``client/cli.py``), the request a client sends (:func:`to_wire`) and the values the daemon
validates from a request (:func:`from_wire`: 422 with pydantic's error list), which the
handler then reads as typed attributes.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from ._errors import InvalidArguments

Where = Literal["path", "query", "header", "body", "local"]


@dataclass(frozen=True)
class Arg:
    """Where a parameter travels and how the CLI spells it (in the field's ``Annotated``)."""

    at: Where = "query"
    # its name on the wire (``q``, ``Capd-Timeout``, the path's ``{name}``) when not the
    # field's; "*" for a field that is the whole JSON body
    key: str | None = None
    flags: tuple[str, ...] = ()  # the CLI's; none: a positional argument
    # a positional taking every remaining word, so that `capd search append a line` needs
    # no quotes (a text field gets them joined by spaces)
    rest: bool = False
    agent: bool = True  # in the MCP tool's input schema (False: the CLI's and HTTP's only)
    brief: bool = False  # in the brief tool set's schema too


P = typing.TypeVar("P", bound="Params")


def arg(default: Any, help: str, *flags: str, at: Where = "query", key: str | None = None,
        rest: bool = False, agent: bool = True, brief: bool = False, **limits: Any) -> Any:
    """A parameter: its default (``...``: none, it is required), its help, the CLI's
    flags (none: a positional), where it travels, and pydantic's limits (``ge``...)."""
    info = Field(default, description=help, **limits)
    info.metadata.append(Arg(at, key, flags, rest, agent, brief))
    return info


class Params(BaseModel):
    """The parameters of a row; a row without any uses this one as it is."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


@dataclass(frozen=True)
class Param:
    """One field of a row's model with where it travels; what is read of its type is
    worked out once (the row's params are made once, then read at every request)."""

    name: str
    info: FieldInfo
    arg: Arg

    @functools.cached_property
    def key(self) -> str:
        return self.arg.key or self.name

    @functools.cached_property
    def kind(self) -> type:
        """The value's type with any ``None`` taken out (``list`` for a list)."""
        bare = _bare(self.info.annotation)
        if typing.get_origin(bare) is Literal:
            return type(typing.get_args(bare)[0])
        origin = typing.get_origin(bare) or bare
        return origin if isinstance(origin, type) else object

    @functools.cached_property
    def many(self) -> bool:
        """Whether the value is a list (sent joined by commas in a query or header)."""
        return self.kind in (list, tuple)

    @functools.cached_property
    def words(self) -> bool:
        """Whether the value is a list of text (which may come as one joined string)."""
        return self.many and typing.get_args(_bare(self.info.annotation))[:1] == (str,)

    @functools.cached_property
    def choices(self) -> tuple[str, ...] | None:
        bare = _bare(self.info.annotation)
        return tuple(typing.get_args(bare)) if typing.get_origin(bare) is Literal else None

    @functools.cached_property
    def max_length(self) -> int | None:
        """The most items the value may hold (None: no bound)."""
        return next((m.max_length for m in self.info.metadata
                     if getattr(m, "max_length", None) is not None), None)


def _bare(annotation: Any) -> Any:
    """``annotation`` with ``| None`` taken out."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


@functools.cache
def params_of(model: type[Params]) -> tuple[Param, ...]:
    """The fields of ``model`` with where each travels (a field with no :class:`Arg` goes
    in the query under its own name)."""
    own = model.__annotations__  # its own fields first, then those it inherits
    names = sorted(model.model_fields, key=lambda name: name not in own)
    return tuple(
        Param(name, info, next((m for m in info.metadata if isinstance(m, Arg)), Arg()))
        for name, info in ((n, model.model_fields[n]) for n in names))


@dataclass(frozen=True)
class Wire:
    """A row's request as a client sends it."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def to_wire(path: str, model: type[Params], values: dict[str, Any]) -> Wire:
    """The request that carries ``values`` (by field name; None and absent ones are left
    out, as is a local one) to a row at ``path``."""
    query: dict[str, str] = {}
    headers: dict[str, str] = {}
    body: Any = None
    for param in params_of(model):
        value = values.get(param.name)
        if value is None or param.arg.at == "local":
            continue
        match param.arg.at:
            case "path":
                path = path.replace("{" + param.key + "}", quote(str(value), safe=""))
            case "query":
                query[param.key] = _text(value)
            case "header":
                headers[param.key] = _text(value)
            case "body" if param.key == "*":
                body = value
            case "body":
                body = {**(body or {}), param.key: value}
    return Wire(path, query, headers, body)


def from_wire(model: type[Params], path: dict[str, str], query: dict[str, str],
              headers: typing.Mapping[str, str], body: Any) -> dict[str, Any]:
    """The values a request carries for ``model``'s fields, to validate with it (a list
    in a query or header arrives joined by commas)."""
    values: dict[str, Any] = {}
    for param in params_of(model):
        match param.arg.at:
            case "path":
                value: Any = path.get(param.key)
            case "query":
                value = query.get(param.key)
            case "header":
                value = headers.get(param.key.lower())
            case "body" if param.key == "*":
                value = body
            case "body":
                value = body.get(param.key) if isinstance(body, dict) else None
            case _:
                value = None
        if isinstance(value, str) and param.arg.at != "path":
            if param.words:  # a list may come joined by commas (or spaces, in a body)
                parts = value.replace(",", " ").split() if param.arg.at == "body" \
                    else value.split(",")
                value = [v.strip() for v in parts if v.strip()]
            elif value == "" and (param.kind is not str or param.choices
                                  or param.arg.at == "body"):
                value = None  # an empty value is no value: the default
        elif isinstance(value, int | float) and not isinstance(value, bool) \
                and param.kind is str:
            value = str(value)  # a number where text is taken (a TTL of 3600): its text
        if value is not None:
            values[param.name] = value
    return values


MAX_ERRORS = 10
"""The most problems a 422 lists: what a caller sends may hold any number."""


def _too_long(model: type[Params], values: dict[str, Any]) -> list[dict[str, Any]]:
    """The values longer than their field allows, found before any item is checked (a
    list of a million wrong items is one problem, not a million)."""
    return [{"type": "too_long", "loc": [p.name],
             "msg": f"at most {p.max_length} items, not {len(values[p.name])}"}
            for p in params_of(model) if p.max_length is not None
            and isinstance(values.get(p.name), list | dict)
            and len(values[p.name]) > p.max_length]


def validate(model: type[P], command: str, path: dict[str, str], query: dict[str, str],
             headers: typing.Mapping[str, str], body: Any) -> P:
    """``model``'s values from a request; :class:`InvalidArguments` (422) names each value
    that does not fit by the name it travelled under."""
    values = from_wire(model, path, query, headers, body)
    errors: list[Any]
    try:
        errors = _too_long(model, values)
        if not errors:
            return model.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
    keys = {p.name: "body" if p.key == "*" else p.key for p in params_of(model)}
    raise InvalidArguments(command, [
        {**e, "loc": [keys.get(str(e["loc"][0]), e["loc"][0]), *e["loc"][1:]] if e["loc"]
         else []} for e in errors[:MAX_ERRORS]], more=max(0, len(errors) - MAX_ERRORS))


@functools.cache
def input_schema(model: type[Params], brief: bool = False) -> dict[str, Any]:
    """The MCP input schema of ``model``'s agent fields (``brief``: only the brief ones),
    with references inlined and ``X | None`` read as an optional ``X``."""
    full = model.model_json_schema()
    defs = full.get("$defs", {})
    keep = {p.name for p in params_of(model)
            if p.arg.agent and p.arg.at != "local" and (p.arg.brief or not brief)}
    properties = {p.name: _plain(full["properties"][p.name], defs)
                  for p in params_of(model) if p.name in keep}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [name for name in full.get("required", ()) if name in keep]
    if required:
        schema["required"] = required
    return schema


def _plain(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_plain(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _plain(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    options = [o for o in node.get("anyOf", ()) if o != {"type": "null"}]
    if "anyOf" in node and len(options) == 1:
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        node = {**options[0], **rest}
        if node.get("default", ...) is None:
            del node["default"]
    return {k: _plain(v, defs) for k, v in node.items() if k != "title"}
