"""The outcome of one call: a :class:`ToolResult` in one of five states."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from capd.registry import model_assembler

ToolResultStatus = Literal[
    "success", "partial", "error_transient", "error_permanent", "error_blocked"
]


STATUS_OF: dict[str, ToolResultStatus] = {
    "success": "success", "partial": "partial",
    "transient": "error_transient", "permanent": "error_permanent", "blocked": "error_blocked",
}


class ToolResult(BaseModel):
    """The outcome of one call."""

    model_config = ConfigDict(frozen=True)

    status: ToolResultStatus
    capability: str
    result: Any = None
    error_type: str | None = None
    message: str | None = None
    alternatives: list[str] = Field(default_factory=list)
    duration_s: float
    request_id: str
    retry_after_s: float | None = None
    queued: str | None = None
    warnings: list[str] = Field(default_factory=list)
    missing_consent: list[str] | None = None
    unavailable_alternatives: dict[str, str] = Field(default_factory=dict)
    answered_by: str | None = None
    # What an upstream MCP server answered, as it said it: its content blocks (text,
    # image, audio, resource, resource_link) and its structuredContent; None otherwise.
    content: list[dict[str, Any]] | None = None
    structured_content: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The result as a JSON-ready mapping (cheaper than model_dump on the hot path)."""
        return dict(self.__dict__)

    @classmethod
    def assemble(cls, values: dict[str, Any]) -> ToolResult:
        """A result from ``values``: every field, in field order, each already of its type.

        What ``model_construct`` does without its per-field loop (a seventh of a
        no-op call's cost); ``values`` becomes the instance's ``__dict__``.
        """
        if len(values) != len(_RESULT_FIELDS):
            raise TypeError(f"a ToolResult needs exactly {', '.join(_RESULT_FIELDS)}; "
                            f"got {', '.join(values)}")
        return _assemble_result(values)

    @property
    def ok(self) -> bool:
        """Whether the call did its work, fully or in part."""
        return self.status in ("success", "partial")


_RESULT_FIELDS = tuple(ToolResult.model_fields)
_assemble_result = model_assembler(ToolResult, {
    **dict.fromkeys(_RESULT_FIELDS), "status": "success", "capability": "a.b", "alternatives": [],
    "duration_s": 0.0, "request_id": "r", "warnings": [], "unavailable_alternatives": {}})
