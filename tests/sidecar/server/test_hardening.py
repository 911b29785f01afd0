"""The core promise, piece by piece: user code off the loop, byte-exact effects, options that
callers cannot shadow, untyped errors classified, a socket folder and a state dir that are ours.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import BaseModel, ValidationError

from capd.recovery import Rechecker, verify_post_write_effects
from capd.recovery._calls import classify_error
from capd.registry import Blocked, Capability, OpTable, PythonProbe, run_probe
from capd.registry._ops import OpSpec
from capd.sidecar._errors import StateDirLocked, UnsafeSocketFolder
from capd.sidecar.server._gateway import Caller, Gateway
from capd.sidecar.server._socket import check_socket_folder
from capd.sidecar.server._statelock import acquire_state_lock
from tests.helpers.fakes import Clock, FlipProbe, Params, make_registry


class Line(BaseModel):
    line: str


def _cap(**extra: Any) -> Capability:
    def func(params: Line, **_options: Any) -> None:
        return None

    fields: dict[str, Any] = {"name": "t.write", "summary": "write", "parameters": Line,
                              "func": func, **extra}
    return Capability(**fields)


@pytest.fixture
def pool() -> Any:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-user")
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


async def _set_later(event: threading.Event) -> None:
    """Set ``event`` from the loop: only possible while the loop is free."""
    await asyncio.sleep(0.05)
    event.set()


# ------------------------------------------------------ user code off the loop


async def test_a_plain_python_probe_runs_off_the_loop(
    plugin_dir: Callable[[str, str], Path], pool: ThreadPoolExecutor
) -> None:
    """A plain probe that waits for the loop to act passes: it does not hold the loop."""
    plugin_dir("loop_probe", """
        import threading
        EVENT = threading.Event()

        def probe() -> bool:
            return EVENT.wait(5)
    """)
    import loop_probe  # type: ignore[import-not-found]

    setter = asyncio.create_task(_set_later(loop_probe.EVENT))
    result = await run_probe("t", PythonProbe(target="loop_probe:probe", timeout_s=5),
                             executor=pool)
    await setter
    assert result.ok, result.error


async def test_a_rechecker_runs_plain_probes_on_its_executor(
    plugin_dir: Callable[[str, str], Path], pool: ThreadPoolExecutor
) -> None:
    """The background re-probe path hands plain probes to the daemon's executor too."""
    plugin_dir("named_probe", """
        import threading

        def probe() -> bool:
            return threading.current_thread().name.startswith("test-user")
    """)
    spec = PythonProbe(target="named_probe:probe", timeout_s=5)
    registry = make_registry({"t.op": ("tool",)}, {"tool": False})
    registry._tools["tool"] = spec
    rechecker = Rechecker(lambda: registry, executor=pool, cooldown_s=0)
    outcome = await rechecker.recheck_tool("tool")
    assert outcome.result.ok, outcome.result.error
    assert outcome.restored == ("t.op",)


async def test_a_plain_verify_op_runs_off_the_loop(pool: ThreadPoolExecutor) -> None:
    """A plain verifier that waits for the loop to act decides 'present'."""
    event = threading.Event()

    def verifier(params: Line) -> bool:
        return event.wait(5)

    table = OpTable()
    table.ops["t.check"] = OpSpec("t.check", verifier, None, "test")
    cap = _cap(mutates_state=True, retry_policy="verify_first",
               effects=[{"kind": "op", "op": "t.check"}])
    setter = asyncio.create_task(_set_later(event))
    verdict = await verify_post_write_effects(cap, Line(line="x"), table, executor=pool)
    await setter
    assert verdict.verdict == "verified", verdict.as_dict()


def _gateway_with(hook: Any, pool: ThreadPoolExecutor, timeout_s: float = 5.0) -> Gateway:
    async def echo(params: Params) -> str:
        return params.text

    registry = make_registry({"t.op": ("tool",)}, {"tool": True}, funcs={"t.op": echo})
    rechecker = Rechecker(lambda: registry, probe=FlipProbe(tool=True), clock=Clock())
    return Gateway(lambda: registry, rechecker, before_hooks=[hook], hook_executor=pool,
                   hook_timeout_s=timeout_s)


async def test_a_plain_before_hook_runs_off_the_loop(pool: ThreadPoolExecutor) -> None:
    """A plain hook that waits for the loop to act lets the call through."""
    event = threading.Event()

    def hook(cap: Capability, params: BaseModel, caller: Caller) -> None:
        if not event.wait(5):
            raise Blocked("the loop never moved")

    gateway = _gateway_with(hook, pool)
    setter = asyncio.create_task(_set_later(event))
    result = await gateway.dispatch("t.op", {"text": "hi"})
    await setter
    assert (result.status, result.result) == ("success", "hi")


@pytest.mark.parametrize(
    ("behaviour", "says"),
    [("slow", "did not answer within 0.2s"), ("raise", "failed (RuntimeError: broken)"),
     ("block", "not today")],
)
async def test_a_hook_that_blocks_raises_or_overruns_refuses_the_call(
    pool: ThreadPoolExecutor, behaviour: str, says: str
) -> None:
    """Hooks fail closed: an overrun or a crash is error_blocked with the reason."""
    release = threading.Event()

    def hook(cap: Capability, params: BaseModel, caller: Caller) -> None:
        if behaviour == "slow":
            release.wait(5)
        elif behaviour == "raise":
            raise RuntimeError("broken")
        else:
            raise Blocked("not today")

    gateway = _gateway_with(hook, pool, timeout_s=0.2)
    result = await gateway.dispatch("t.op", {"text": "hi"})
    release.set()
    assert result.status == "error_blocked"
    assert says in (result.message or ""), result.message


# ------------------------------------------------------- byte-exact effects


@pytest.mark.parametrize(
    "char", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
async def test_file_contains_matches_a_line_holding_any_line_break_but_newline(
    tmp_path: Path, char: str
) -> None:
    """A landed line holding \\r, \\x0b, \\x85, \\u2028 (...) is found exactly as written."""
    note = tmp_path / "note.md"
    line = f"before{char}after"
    with note.open("a", encoding="utf-8", newline="") as handle:
        handle.write("# head\n" + line + "\n")
    cap = _cap(mutates_state=True, retry_policy="verify_first",
               effects=[{"kind": "file_contains", "path": str(note), "line": "{line}"}])
    landed = await verify_post_write_effects(cap, Line(line=line))
    assert landed.verdict == "verified", landed.as_dict()
    for other in ("before", "after", f"before{char}"):
        absent = await verify_post_write_effects(cap, Line(line=other))
        assert absent.verdict == "absent", (other, absent.as_dict())


def test_a_parameter_may_not_shadow_an_option() -> None:
    """A parameter named like an option is refused at load: a caller never picks the file."""
    with pytest.raises(ValidationError, match="has the name of an option"):
        _cap(options={"line": "/srv/notes/log.md"}, mutates_state=True,
             retry_policy="verify_first",
             effects=[{"kind": "file_exists", "path": "{line}"}])


async def test_options_win_over_parameters_in_effect_templates(tmp_path: Path) -> None:
    """Rendering puts options last: the option's path is the one verified."""
    target = tmp_path / "real.txt"
    target.write_text("x\n")

    class Loose(BaseModel):
        model_config = {"extra": "allow"}
        line: str

    cap = Capability(name="t.write", summary="w", parameters=Loose, func=lambda p, **o: None,
                     mutates_state=True, retry_policy="verify_first", options={"path": str(target)},
                     effects=[{"kind": "file_contains", "path": "{path}", "line": "{line}"}])
    # an extra key named like the option reaches model_dump, and must not win
    params = Loose.model_validate({"line": "x", "path": str(tmp_path / "elsewhere")})
    verdict = await verify_post_write_effects(cap, params)
    assert verdict.verdict == "verified", verdict.as_dict()


# -------------------------------------------------- untyped errors classified


class FakeHttpxConnectError(Exception):
    """Stands for httpx.ConnectError: matched by package and class name."""


FakeHttpxConnectError.__module__ = "httpx._exceptions"
FakeHttpxConnectError.__qualname__ = "TransportError"


class Flaky(Exception):
    pass


def _network_error() -> OSError:
    try:
        raise RuntimeError("sync failed") from ConnectionResetError("peer reset")
    except RuntimeError as exc:
        return exc  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("exc", "kind", "network"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "transient", True),
        (ConnectionResetError("reset"), "transient", True),
        (TimeoutError("read timed out"), "transient", True),
        (OSError(errno.ENETUNREACH, "unreachable"), "transient", True),
        (OSError(errno.EHOSTUNREACH, "no route"), "transient", True),
        (aiohttp.ServerDisconnectedError(), "transient", True),
        (aiohttp.ClientConnectionError("gone"), "transient", True),
        (FakeHttpxConnectError("connect failed"), "transient", True),
        (_network_error(), "transient", True),
        (OSError(errno.ENOENT, "no such file"), "permanent", False),
        (ValueError("bad"), "permanent", False),
        (KeyError("missing"), "permanent", False),
    ],
)
def test_untyped_errors_are_classified_by_what_they_mean(
    exc: Exception, kind: str, network: bool
) -> None:
    """Network failures are transient (and mark tools down); everything else is permanent."""
    assert classify_error(_cap(), exc) == (kind, network)


def test_a_capability_declares_more_transient_or_permanent_errors_by_name() -> None:
    """transient_errors / permanent_errors by dotted name, the permanent list first."""
    cap = _cap(transient_errors=[f"{__name__}.Flaky"],
               permanent_errors=["builtins.ConnectionRefusedError"])
    assert classify_error(cap, Flaky("later")) == ("transient", False)
    assert classify_error(cap, ConnectionRefusedError("no")) == ("permanent", False)
    with pytest.raises(ValidationError):
        _cap(transient_errors=["not a dotted name"])


# ------------------------------------------------ folders that are ours


def test_a_socket_folder_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """Like tmux: a folder another uid owns could have its socket replaced."""
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(UnsafeSocketFolder, match="belongs to uid 65534"):
        check_socket_folder(folder)


@pytest.mark.parametrize(("mode", "ok"), [(0o700, True), (0o750, True), (0o770, True),
                                          (0o777, False), (0o1777, True)])
def test_a_socket_folder_others_may_write_in_needs_the_sticky_bit(
    tmp_path: Path, mode: int, ok: bool
) -> None:
    """World-writable without the sticky bit is refused; /tmp-style sticky folders are fine."""
    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(mode)
    if ok:
        check_socket_folder(folder)
    else:
        with pytest.raises(UnsafeSocketFolder, match="chmod 750"):
            check_socket_folder(folder)


def test_the_state_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    """A second lock on one state dir fails with the holder's pid; released, it is free."""
    held = acquire_state_lock(tmp_path / "state")
    with pytest.raises(StateDirLocked) as caught:
        acquire_state_lock(tmp_path / "state")
    assert caught.value.holder_pid == os.getpid()
    assert f"pid {os.getpid()}" in str(caught.value)
    held.release()
    acquire_state_lock(tmp_path / "state").release()
