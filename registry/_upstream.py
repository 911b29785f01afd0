"""Upstream MCP servers' tools as capabilities, and their resources and prompts by name.

Every tool the server lists (through ``include``/``exclude`` globs) becomes a
capability ``<prefix>.<tool>`` requiring the server's tool id: the upstream's
input schema (validated with jsonschema), its description (the summary cut at a
sentence boundary within the capsule budget, the full text in the manifest) and
defaults from its annotations: ``readOnlyHint`` → not mutating; otherwise
mutating (MCP's own default), with the tool's ``retry_policy`` (``manual``
unless configured).

Resources and prompts keep the server's names under its prefix: a prompt
``<prefix>.<name>``, a resource ``capd://<prefix>/<the server's uri>`` (templates
alike). The sessions themselves are :mod:`._upstream_session`'s.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from ._model import DESCRIPTION_MAX_TOKENS, Capability, McpProbe, Safety, estimate_tokens
from ._outcomes import PermanentToolError, ToolAnswer

if TYPE_CHECKING:  # the SDK's types and jsonschema are imported when an upstream is used
    import mcp_types as types

SUMMARY_TOKENS = 200
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# -- resources and prompts under the server's prefix ----------------------------------------

RESOURCE_SCHEME = "capd://"


class UnknownOffer(LookupError):
    """A resource or prompt name that no configured server has."""


def resource_uri(prefix: str, uri: str) -> str:
    """How capd names a server's resource: ``capd://<prefix>/<the server's uri>``."""
    return f"{RESOURCE_SCHEME}{prefix}/{uri}"


def split_resource_uri(uri: str) -> tuple[str, str]:
    """(prefix, the server's uri) of a :func:`resource_uri`; raise :class:`UnknownOffer`."""
    prefix, slash, own = uri.removeprefix(RESOURCE_SCHEME).partition("/")
    if not uri.startswith(RESOURCE_SCHEME) or not slash or not prefix or not own:
        raise UnknownOffer(f"{uri!r} is not a resource capd serves: its resources are "
                           "capd://<server prefix>/<the server's uri>; list them with "
                           "GET /resources")
    return prefix, own


def offer_as_json(prefix: str, kind: str, item: Any) -> dict[str, Any]:
    """A server's resource, template or prompt as JSON, named under ``prefix``."""
    data: dict[str, Any] = item.model_dump(mode="json", by_alias=True, exclude_none=True)
    if "name" in data:
        data["name"] = f"{prefix}.{data['name']}"
    if kind == "resources":
        data["uri"] = resource_uri(prefix, data["uri"])
    elif kind == "templates":
        data["uriTemplate"] = resource_uri(prefix, data["uriTemplate"])
    return data


def contents_as_json(prefix: str, result: Any) -> dict[str, Any]:
    """A ``resources/read`` result as JSON, each content's uri named under ``prefix``."""
    data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    for content in data.get("contents", []):
        if isinstance(content.get("uri"), str):
            content["uri"] = resource_uri(prefix, content["uri"])
    return data


# -- capabilities from an upstream's tools -------------------------------------------------


def capability_name(prefix: str, tool_name: str) -> str:
    """``<prefix>.<tool>``, the tool name folded to what a capability name allows."""
    folded = re.sub(r"[^a-z0-9_]+", "_", tool_name.lower()).strip("_") or "tool"
    if not folded[0].isalpha():
        folded = "t_" + folded
    return f"{prefix}.{folded}"


def summarize(text: str, budget_tokens: int = SUMMARY_TOKENS) -> str:
    """The longest run of whole sentences that fits the capsule budget (at least one
    sentence, cut at a word if that alone is too long)."""
    text = " ".join(text.split())
    if estimate_tokens(text) <= budget_tokens:
        return text
    return (_fitting(_SENTENCE_END.split(text), budget_tokens)
            or _fitting(text.split(), budget_tokens, " …") + " …")


def _fitting(parts: Sequence[str], budget_tokens: int, tail: str = "") -> str:
    """The longest run of ``parts`` from the first, joined by spaces, that fits the budget
    with ``tail`` after it."""
    out = ""
    for part in parts:
        candidate = f"{out} {part}".strip()
        if estimate_tokens(candidate + tail) > budget_tokens:
            break
        out = candidate
    return out


def _parameters_for(tool: types.Tool) -> type[BaseModel]:
    """A model whose JSON Schema is the upstream's and whose validation is jsonschema's."""
    import jsonschema

    schema = dict(tool.input_schema or {"type": "object"})
    schema.setdefault("type", "object")
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)

    class UpstreamParams(BaseModel):
        model_config = ConfigDict(extra="allow", frozen=True)

        @model_validator(mode="before")
        @classmethod
        def _check(cls, data: Any) -> Any:
            errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
            if errors:
                first = errors[0]
                where = ".".join(str(p) for p in first.absolute_path) or "params"
                more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                raise ValueError(f"{where}: {first.message}{more}")
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(schema)

    UpstreamParams.__name__ = f"{tool.name}_params"
    return UpstreamParams


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def needs_tasks(tool: types.Tool) -> bool:
    """Whether the server runs ``tool`` only as an MCP task (``execution.taskSupport`` is
    ``required``): a plain ``tools/call`` of it always fails."""
    execution = getattr(tool, "execution", None)
    return getattr(execution, "task_support", None) == "required"


def left_out_tools(tool_id: str, spec: McpProbe, tools: Sequence[types.Tool]) -> dict[str, str]:
    """The capabilities an upstream's tools would be, left out, with why (by name)."""
    prefix = name_prefix(tool_id, spec)
    return {capability_name(prefix, t.name): (
        f"{tool_id} runs {t.name} only as an MCP task (execution.taskSupport = required), "
        "and capd calls tools with tools/call; it is not offered")
        for t in tools if _listed(t, spec) and needs_tasks(t)}


def name_prefix(tool_id: str, spec: McpProbe) -> str:
    """What an upstream's capability names start with: its ``prefix``, else the tool id."""
    return spec.prefix or re.sub(r"[^a-z0-9_]", "_", tool_id.lower())


def _listed(tool: types.Tool, spec: McpProbe) -> bool:
    """Whether ``include``/``exclude`` let the server's ``tool`` through."""
    return _matches(tool.name, spec.include) and not _matches(tool.name, spec.exclude)


def upstream_capabilities(tool_id: str, spec: McpProbe, tools: Sequence[types.Tool],
                          call: Callable[[str, str, dict[str, Any]],
                                         Awaitable[types.CallToolResult]],
                          source: str) -> list[Capability]:
    """One capability per listed tool (through include/exclude)."""
    prefix = name_prefix(tool_id, spec)
    out: list[Capability] = []
    for tool in tools:
        if not _listed(tool, spec) or needs_tasks(tool):  # task-only: see left_out_tools
            continue
        notes = tool.annotations
        read_only = bool(notes and notes.read_only_hint)
        safety: Safety = "read_only" if read_only else "writes"
        if not read_only and notes is not None and notes.destructive_hint is True:
            safety = "destructive"
        description = (tool.description or tool.title or f"The {tool.name} tool of "
                       f"{tool_id}.").strip()
        if estimate_tokens(description) > DESCRIPTION_MAX_TOKENS:
            # An upstream's text is not ours to edit: cut it to the manifest's budget.
            description = summarize(description, DESCRIPTION_MAX_TOKENS)
        out.append(Capability(
            name=capability_name(prefix, tool.name),
            summary=summarize(description),
            description=description,
            parameters=_parameters_for(tool),
            func=_caller(tool_id, tool.name, call),
            requires=(tool_id,),
            mutates_state=not read_only,
            safety=safety,
            retry_policy=spec.retry_policy if not read_only else "manual",
            tags=(*spec.tags, "mcp", tool_id),
            # the SDK's read timeout decides first; the stall ping has its time after it
            timeout_s=min(3600.0, spec.call_timeout_s + spec.ping_timeout_s + 1),
            op_id=f"mcp:{tool_id}:{tool.name}",
            upstream_tool=tool.model_dump(mode="json", by_alias=True, exclude_none=True,
                                          include={"title", "annotations", "output_schema",
                                                   "meta", "icons"}),
            source=source,
        ))
    return out


def _caller(tool_id: str, tool_name: str,
            call: Callable[[str, str, dict[str, Any]], Awaitable[types.CallToolResult]]
            ) -> Callable[..., Awaitable[Any]]:
    async def invoke(params: BaseModel) -> Any:
        import mcp_types as types

        result = await call(tool_id, tool_name, params.model_dump(mode="json"))
        text = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
        value = result.structured_content if result.structured_content is not None else text
        # Every block as it came (images, audio, resources, links: nothing dropped), an
        # error's too.
        content = tuple(c.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for c in result.content)
        answer = ToolAnswer(value, content, result.structured_content)
        if result.is_error:
            raise PermanentToolError(text or f"{tool_id} {tool_name} answered an error",
                                     answer=answer)
        return answer

    invoke.__name__ = f"mcp_{tool_name}"
    return invoke
