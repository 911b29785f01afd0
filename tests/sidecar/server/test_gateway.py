"""Gateway.dispatch: validation, recheck-before-call, timeouts and the five states."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from capd.recovery import Rechecker
from capd.registry import (
    Blocked,
    Capability,
    Partial,
    PermanentToolError,
    ToolUnavailable,
    TransientToolError,
    UnknownCapability,
)
from capd.sidecar._errors import Draining, InvalidParams
from capd.sidecar.server._gateway import Caller, Gateway, ToolResult
from tests.helpers.fakes import Clock, FlipProbe, Params, make_registry


def gateway_for(func: Any, *, up: bool = True, failure_sink: Any = None,
                **extra: Any) -> tuple[Gateway, FlipProbe, Any]:
    registry = make_registry({"t.op": ("tool",), "t.sibling": ("other",)},
                             {"tool": up, "other": True}, funcs={"t.op": func},
                             **{"t.op": {"tags": ("x",), **extra}, "t.sibling": {"tags": ("x",)}})
    probe = FlipProbe(tool=up, other=True)
    rechecker = Rechecker(lambda: registry, probe=probe, clock=Clock(), cooldown_s=30)
    return Gateway(lambda: registry, rechecker, failure_sink=failure_sink), probe, registry


async def echo(params: Params) -> str:
    return params.text


def raiser(exc: BaseException) -> Any:
    async def op(params: Params) -> None:
        raise exc

    return op


async def test_success() -> None:
    """A clean return is success with the value and a duration."""
    gateway, _, _ = gateway_for(echo)
    result = await gateway.dispatch("t.op", {"text": "hi"}, Caller(pid=1))
    assert (result.status, result.result, result.error_type) == ("success", "hi", None)
    assert result.duration_s >= 0
    assert gateway.stats.as_dict()["t.op"]["calls"] == {"success": 1}


@pytest.mark.parametrize(
    ("exc", "status", "error_type"),
    [
        (TransientToolError("busy", retry_after_s=3), "error_transient", "transient"),
        (PermanentToolError("no such row"), "error_permanent", "permanent"),
        (Blocked("not allowed"), "error_blocked", "blocked"),
        (ValueError("bad"), "error_permanent", "ValueError"),
        (KeyError("k"), "error_permanent", "KeyError"),
    ],
)
async def test_exceptions_are_classified(exc: Exception, status: str, error_type: str) -> None:
    """Typed errors map to their states; anything else is permanent, its type named."""
    gateway, _, _ = gateway_for(raiser(exc))
    result = await gateway.dispatch("t.op", {})
    assert (result.status, result.error_type) == (status, error_type)
    assert result.alternatives == ["t.sibling"]


async def test_retry_after_hint_is_kept() -> None:
    """A transient error's retry-after hint reaches the result."""
    gateway, _, _ = gateway_for(raiser(TransientToolError("busy", retry_after_s=3)))
    assert (await gateway.dispatch("t.op", {})).retry_after_s == 3


async def test_partial() -> None:
    """Returning Partial is the partial state with its message."""
    async def op(params: Params) -> Partial:
        return Partial({"done": 1}, "1 of 2 written")

    gateway, _, _ = gateway_for(op)
    result = await gateway.dispatch("t.op", {})
    assert (result.status, result.result, result.message) == (
        "partial", {"done": 1}, "1 of 2 written")


async def test_timeout_is_transient() -> None:
    """A call over its timeout_s is cancelled and reported as a transient timeout."""
    async def slow(params: Params) -> None:
        await asyncio.sleep(10)

    gateway, _, _ = gateway_for(slow, timeout_s=0.05)
    result = await gateway.dispatch("t.op", {})
    assert (result.status, result.error_type) == ("error_transient", "timeout")
    assert result.message == "t.op did not finish within 0.05s"


async def test_tool_unavailable_disables_the_capability_passively() -> None:
    """ToolUnavailable is transient and marks the tool down, disabling its capabilities."""
    gateway, _, registry = gateway_for(raiser(ToolUnavailable("socket gone", tool="tool")))
    result = await gateway.dispatch("t.op", {})
    assert (result.status, result.error_type) == ("error_transient", "tool_unavailable")
    entry = registry.disabled_entry("t.op")
    assert entry is not None
    assert entry.errors["tool"] == "reported by t.op: socket gone"


async def test_disabled_capability_is_rechecked_first_and_called_when_back() -> None:
    """A call to a disabled capability re-probes its tools and succeeds if they are back."""
    gateway, probe, registry = gateway_for(echo, up=False)
    probe.up["tool"] = True
    result = await gateway.dispatch("t.op", {"text": "back"})
    assert (result.status, result.result) == ("success", "back")
    assert probe.calls["tool"] == 1
    assert registry.is_live("t.op")


async def test_disabled_capability_still_down_is_a_transient_error_naming_the_tool() -> None:
    """When the recheck fails the call is not made and the result names the missing tool."""
    called = False

    async def op(params: Params) -> None:
        nonlocal called
        called = True

    gateway, _, _ = gateway_for(op, up=False)
    result = await gateway.dispatch("t.op", {})
    assert (result.status, result.error_type) == ("error_transient", "capability_disabled")
    assert result.message == "t.op is disabled: missing tool (tool: tool is down)"
    assert called is False


async def test_invalid_params_and_unknown_names_raise() -> None:
    """Invalid params raise InvalidParams with pydantic's list; unknown names fail closed."""
    gateway, _, _ = gateway_for(echo)
    with pytest.raises(InvalidParams) as info:
        await gateway.dispatch("t.op", {"text": 5})
    assert info.value.errors[0]["loc"] == ("text",)
    with pytest.raises(UnknownCapability):
        await gateway.dispatch("t.nope", {})


async def test_draining_refuses_new_calls() -> None:
    """While draining, dispatch raises Draining and calls nothing."""
    gateway, _, _ = gateway_for(echo)
    gateway.draining = True
    with pytest.raises(Draining):
        await gateway.dispatch("t.op", {})


async def test_before_hook_can_block() -> None:
    """A before-hook raising Blocked stops the call with error_blocked."""
    gateway, _, registry = gateway_for(echo)

    async def hook(cap: Capability, params: BaseModel, caller: Caller) -> None:
        if caller.uid == 666:
            raise Blocked("uid 666 may not call t.op")

    gateway = Gateway(lambda: registry, gateway._rechecker, before_hooks=[hook])
    assert (await gateway.dispatch("t.op", {}, Caller(uid=1))).status == "success"
    blocked = await gateway.dispatch("t.op", {}, Caller(uid=666))
    assert (blocked.status, blocked.message) == ("error_blocked", "uid 666 may not call t.op")


async def test_in_flight_is_tracked_and_wait_idle_returns_when_done() -> None:
    """in_flight counts running calls; wait_idle returns once they finish."""
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def op(params: Params) -> str:
        entered.set()
        await gate.wait()
        return "done"

    gateway, _, _ = gateway_for(op)
    call = asyncio.create_task(gateway.dispatch("t.op", {}))
    await asyncio.wait_for(entered.wait(), 5)
    assert gateway.in_flight == 1
    idle = asyncio.create_task(gateway.wait_idle())
    await asyncio.sleep(0)  # one loop turn: wait_idle is waiting
    assert not idle.done()
    gate.set()
    await asyncio.wait_for(idle, 5)
    assert (await call).result == "done"


async def test_failure_sink_receives_transient_failures_of_mutating_calls() -> None:
    """The retry-queue seam: a mutating capability's transient failure goes to the sink."""
    seen: list[str] = []

    class Sink:
        async def accept(self, capability: Capability, params: BaseModel,
                         result: ToolResult, *, idempotency_key: str | None = None,
                         running: Any = None) -> ToolResult:
            seen.append(capability.name)
            return result.model_copy(update={"queued": "job-1"})

    gateway, _, _ = gateway_for(raiser(TransientToolError("later")), mutates_state=True,
                                retry_policy="replay", failure_sink=Sink())
    result = await gateway.dispatch("t.op", {})
    assert (seen, result.queued) == (["t.op"], "job-1")


async def test_alternatives_share_a_tag_that_says_what_they_do_never_a_write_for_a_read() -> None:
    """The "mcp" tag every upstream tool carries, and the id of the server a capability
    needs, make no alternative; a failed read is offered reads only, inside the grant."""
    from capd.sidecar.server._grant import Grant, Profile

    registry = make_registry(
        {"a.read": ("srv_a",), "b.write": ("srv_b",), "b.read": ("srv_b",),
         "a.other": ("srv_a",), "c.lookup": (), "c.hidden": ()},
        {"srv_a": True, "srv_b": True}, funcs={"a.read": raiser(TimeoutError("down"))},
        **{"a.read": {"tags": ("mcp", "srv_a", "lookup")},
           "a.other": {"tags": ("mcp", "srv_a")},
           "b.write": {"tags": ("mcp", "srv_b", "lookup"), "mutates_state": True},
           "b.read": {"tags": ("mcp", "srv_b")},
           "c.lookup": {"tags": ("lookup",)}, "c.hidden": {"tags": ("lookup",)}})
    gateway = Gateway(lambda: registry, Rechecker(lambda: registry, probe=FlipProbe(),
                                                  clock=Clock(), cooldown_s=30))
    failed = await gateway.dispatch("a.read", {"text": "x"})
    assert failed.status == "error_transient"
    assert failed.alternatives == ["c.hidden", "c.lookup"]
    narrow = Grant("agent", Profile("p", ("a.*", "c.lookup")), bound=True)
    seen = await gateway.dispatch("a.read", {"text": "x"}, Caller(uid=7, grant=narrow))
    assert seen.alternatives == ["c.lookup"]
