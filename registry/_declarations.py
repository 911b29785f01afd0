"""Inert TOML declarations turned into capabilities.

A declaration file holds one or many ``[[capability]]`` tables, each naming an
``op`` plus metadata, optionally ``[tools.<id>]`` tables, and ``[[topology]]``
tables (``_topology.py``)::

    [tools.vault]
    kind = "path"
    path = "{config_dir}/vault"

    [[capability]]
    name = "notes.append"
    op = "notes.append"
    summary = "Append a line to a markdown note."
    requires = ["vault"]
    options = { vault = "{config_dir}/vault" }

Every problem becomes a :class:`DeclarationError` naming the file, the
capability (or topology) and the field; one bad declaration never stops the others.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ._errors import ConfigError, DeclarationError
from ._model import Capability, ToolSpec
from ._names import close_hint
from ._ops import CapabilitySpec, OpTable, infer_parameters
from ._template import TemplateError, render
from ._topology import RESERVED_IDS, Topology, TopologySet

_TOOL_ADAPTER: TypeAdapter[ToolSpec] = TypeAdapter(ToolSpec)
_FILE_KEYS = {"capability", "tools", "topology"}
_RESERVED = {"func", "parameters", "op_id", "source"}


@dataclass
class DeclarationSet:
    """What loading found: capabilities, tools, topologies and errors, in load order.

    ``errors`` holds every error, those of ``[[topology]]`` tables included (a
    build reports them all); ``topology_errors`` holds those again, and
    ``broken_topologies`` each by its id where the id could be read.
    """

    capabilities: list[Capability] = field(default_factory=list)
    tools: dict[str, ToolSpec] = field(default_factory=dict)
    tool_sources: dict[str, str] = field(default_factory=dict)
    errors: list[DeclarationError] = field(default_factory=list)
    topologies: dict[str, Topology] = field(default_factory=dict)
    topology_errors: list[DeclarationError] = field(default_factory=list)
    broken_topologies: dict[str, DeclarationError] = field(default_factory=dict)

    def topology_set(self) -> TopologySet:
        """The topologies found, with the errors of the tables that did not load."""
        return TopologySet(dict(self.topologies), tuple(self.topology_errors),
                           dict(self.broken_topologies))

    def add_topology_error(self, error: DeclarationError, topology_id: object = None) -> None:
        """Record a ``[[topology]]`` table that did not load (by ``topology_id`` if a string)."""
        self.errors.append(error)
        self.topology_errors.append(error)
        if isinstance(topology_id, str):
            self.broken_topologies.setdefault(topology_id, error)


def describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """Return one readable sentence for ``exc`` and the first offending field."""
    parts: list[str] = []
    first_field: str | None = None
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if first_field is None and err["loc"]:
            first_field = str(err["loc"][0])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts), first_field


def render_vars(value: Any, variables: Mapping[str, str]) -> Any:
    """Substitute ``{var}`` in every string inside ``value`` (lists and tables included)."""
    if isinstance(value, str):
        return render(value, variables)
    if isinstance(value, list):
        return [render_vars(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: render_vars(v, variables) for k, v in value.items()}
    return value


def parse_tool(tool_id: str, raw: Any, source: str, variables: Mapping[str, str]) -> ToolSpec:
    """Validate one tool table, with ``{var}`` substituted; raise :class:`DeclarationError`."""
    try:
        return _TOOL_ADAPTER.validate_python(render_vars(raw, variables))
    except TemplateError as exc:
        raise DeclarationError(source, f"tool {tool_id!r}: {exc}", field="tools") from exc
    except ValidationError as exc:
        text, _ = describe_validation_error(exc)
        raise DeclarationError(source, f"tool {tool_id!r}: {text}", field="tools") from exc


def capability_from_spec(spec: CapabilitySpec) -> Capability:
    """Turn a ``@capability`` marker into a :class:`Capability`; raise :class:`DeclarationError`."""
    params = spec.parameters or infer_parameters(spec.func)
    if params is None:
        raise DeclarationError(spec.source, "cannot tell the parameter model: annotate the first "
                               "argument with a pydantic model or pass params=",
                               capability=spec.name, field="parameters")
    try:
        return Capability(name=spec.name, func=spec.func, parameters=params, source=spec.source,
                          **spec.meta)
    except ValidationError as exc:
        text, fld = describe_validation_error(exc)
        raise DeclarationError(spec.source, text, capability=spec.name, field=fld) from exc


def _declared_capability(
    raw: Any, source: str, index: int, ops: OpTable, variables: Mapping[str, str]
) -> Capability:
    if not isinstance(raw, dict):
        raise DeclarationError(source, f"capability[{index}] must be a table")
    name = raw.get("name")
    label = name if isinstance(name, str) else f"capability[{index}]"

    def refused(message: str, field: str | None = None) -> DeclarationError:
        return DeclarationError(source, message, capability=label, field=field)

    data = dict(raw)
    for key in _RESERVED & data.keys():
        raise refused(f"field '{key}' cannot be declared; it comes from the op", key)
    op_id = data.pop("op", None)
    if not isinstance(op_id, str) or not op_id:
        raise refused("missing field 'op' (the op id to call)", "op")
    spec = ops.ops.get(op_id)
    if spec is None:
        hint = close_hint(op_id, ops.ops) or f" (known ops: {', '.join(sorted(ops.ops)) or 'none'})"
        raise refused(f"unknown op {op_id!r}{hint}", "op")
    params = spec.parameters or infer_parameters(spec.func)
    if params is None:
        raise refused(f"op {op_id!r} ({spec.source}) has no pydantic parameter model", "op")
    try:
        if "options" in data:
            data["options"] = render_vars(data["options"], variables)
    except TemplateError as exc:
        raise refused(f"options: {exc}", "options") from exc
    try:
        return Capability(func=spec.func, parameters=params, op_id=op_id, source=source, **data)
    except ValidationError as exc:
        raise refused(*describe_validation_error(exc)) from exc
    except TypeError as exc:  # a non-string key in the table
        raise refused(str(exc)) from exc


def declaration_files(paths: Iterable[Path]) -> list[Path]:
    """Expand folders to their ``*.toml`` files (sorted); raise :class:`ConfigError` if missing."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.glob("*.toml") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"declarations: {path} does not exist; fix the path in "
                              "'declarations' or create it")
    return files


def load_declarations(
    paths: Iterable[Path],
    ops: OpTable,
    variables: Mapping[str, str],
    *,
    label_root: Path | None = None,
) -> DeclarationSet:
    """Load every declaration file under ``paths`` against ``ops``.

    Errors are collected, never raised, except :class:`ConfigError` for a path
    that does not exist.
    """
    result = DeclarationSet()
    for file in declaration_files(paths):
        source = _label(file, label_root)
        doc = _read(file, source)
        if isinstance(doc, DeclarationError):
            result.errors.append(doc)
            continue
        result.errors += [DeclarationError(source, f"unknown top-level key {key!r} (expected "
                                           "[[capability]], [tools.<id>] or [[topology]])",
                                           field=key) for key in doc.keys() - _FILE_KEYS]
        if "topology" in doc:
            _add_topologies(doc["topology"], source, result)
        tools = doc.get("tools", {})
        if not isinstance(tools, dict):
            result.errors.append(DeclarationError(source, "'tools' must be a table", field="tools"))
            tools = {}
        for tool_id, raw in tools.items():
            try:
                result.tools[tool_id] = parse_tool(tool_id, raw, source, variables)
                result.tool_sources[tool_id] = source
            except DeclarationError as exc:
                result.errors.append(exc)
        entries = doc.get("capability", [])
        if not isinstance(entries, list):
            result.errors.append(DeclarationError(
                source, "use [[capability]] (an array of tables)", field="capability"))
            continue
        for index, raw in enumerate(entries):
            try:
                result.capabilities.append(_declared_capability(raw, source, index, ops, variables))
            except DeclarationError as exc:
                result.errors.append(exc)
    return result


def load_topologies(paths: Iterable[Path], *, label_root: Path | None = None) -> TopologySet:
    """Read only the ``[[topology]]`` tables of the declaration files under ``paths``.

    Never raises: a file that cannot be read (or a path that no longer exists) is
    an error of the set, as a broken table is. Blocking: call it off the loop.
    """
    result = DeclarationSet()
    try:
        files = declaration_files(paths)
    except ConfigError as exc:
        result.add_topology_error(DeclarationError("declarations", str(exc), whole_file=True))
        files = []
    for file in files:
        source = _label(file, label_root)
        doc = _read(file, source)
        if isinstance(doc, DeclarationError):
            result.add_topology_error(doc)
        elif "topology" in doc:
            _add_topologies(doc["topology"], source, result)
    return result.topology_set()


def _read(file: Path, source: str) -> dict[str, Any] | DeclarationError:
    """The TOML document in ``file``, or the error that says why it cannot be had."""
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        why = f"cannot read: {exc.strerror}" if isinstance(exc, OSError) else (
            f"not valid TOML: {exc}")
        error = DeclarationError(source, why, whole_file=True)
        error.__cause__ = exc  # collected, not raised: keep the cause as `from exc` would
        return error


def _add_topologies(raw: Any, source: str, result: DeclarationSet) -> None:
    """Validate the ``[[topology]]`` array of one file into ``result``; never raises.

    The first declaration of an id wins; a later one is an error naming both files.
    """
    if not isinstance(raw, list):
        result.add_topology_error(DeclarationError(
            source, "use [[topology]] (an array of tables)", field="topology"))
        return
    for index, table in enumerate(raw):
        topology_id = table.get("id") if isinstance(table, dict) else None
        try:
            topology = _declared_topology(table, source, index)
        except DeclarationError as exc:
            result.add_topology_error(exc, topology_id)
            continue
        first = result.topologies.get(topology.id)
        if first is not None:
            result.add_topology_error(DeclarationError(
                source, f"topology {topology.id!r} is already declared by {first.source}",
                field="id"))
            continue
        result.topologies[topology.id] = topology


def _declared_topology(table: Any, source: str, index: int) -> Topology:
    label = repr(table["id"]) if isinstance(table, dict) and isinstance(
        table.get("id"), str) else f"[{index}]"
    if not isinstance(table, dict):
        raise DeclarationError(source, f"topology {label} must be a table", field="topology")
    if "source" in table:
        raise DeclarationError(source, f"topology {label}: field 'source' cannot be declared; "
                               "it is the file's name", field="source")
    if table.get("id") in RESERVED_IDS:
        raise DeclarationError(source, f"topology {label}: the id is reserved (a route of the "
                               "API is named so); choose another", field="id")
    try:
        return Topology.model_validate({**table, "source": source})
    except ValidationError as exc:
        text, fld = describe_validation_error(exc)
        raise DeclarationError(source, f"topology {label}: {text}", field=fld) from exc


def _label(file: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(file.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(file)
