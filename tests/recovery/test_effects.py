"""Effect verification: each kind present, absent and unknown, and the combined verdicts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from capd.recovery import combine, verify_post_write_effects
from capd.registry import Capability, OpTable, op
from capd.registry._ops import OpSpec
from tests.helpers.daemon import FlipServer


class Note(BaseModel):
    note: str
    line: str


def cap(effects: list[dict[str, Any]], **options: str) -> Capability:
    def func(params: Note) -> None:
        return None

    return Capability(name="notes.append", summary="x", parameters=Note, func=func,
                      mutates_state=True, retry_policy="verify_first", effects=effects,
                      options=options)


P = Note(note="today", line="- milk")


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    (tmp_path / "today.md").write_text("# Today\n- milk\n")
    return tmp_path


@pytest.mark.parametrize(("line", "status"), [("- milk", "present"), ("- eggs", "absent")])
async def test_file_contains_line(vault: Path, line: str, status: str) -> None:
    """A literal line is found only as a whole line."""
    c = cap([{"kind": "file_contains", "path": "{vault}/{note}.md", "line": "{line}"}],
            vault=str(vault))
    result = await verify_post_write_effects(c, Note(note="today", line=line))
    assert result.checks[0].status == status


async def test_file_contains_regex_escapes_parameters(vault: Path) -> None:
    """Parameters inside a regex are matched literally."""
    c = cap([{"kind": "file_contains", "path": "{vault}/{note}.md", "regex": "^{line}$"}],
            vault=str(vault))
    assert (await verify_post_write_effects(c, P)).verdict == "verified"
    tricky = Note(note="today", line=".*")
    assert (await verify_post_write_effects(c, tricky)).verdict == "absent"


async def test_missing_file_is_absent_and_unreadable_is_unknown(vault: Path) -> None:
    """No file: absent. A folder where the file should be: cannot decide."""
    c = cap([{"kind": "file_contains", "path": "{vault}/{note}.md", "line": "{line}"}],
            vault=str(vault))
    assert (await verify_post_write_effects(c, Note(note="nope", line="x"))).verdict == "absent"
    (vault / "dir.md").mkdir()
    unknown = await verify_post_write_effects(c, Note(note="dir", line="x"))
    assert unknown.verdict == "unknown"
    assert "IsADirectoryError" in unknown.checks[0].detail


async def test_file_exists(vault: Path) -> None:
    """file_exists is present or absent."""
    c = cap([{"kind": "file_exists", "path": "{vault}/{note}.md"}], vault=str(vault))
    assert (await verify_post_write_effects(c, P)).verdict == "verified"
    assert (await verify_post_write_effects(c, Note(note="x", line="y"))).verdict == "absent"


@pytest.fixture
def server() -> Iterator[FlipServer]:
    with FlipServer() as s:
        yield s


async def test_http_effect_present_absent_unknown(server: FlipServer, free_port: int) -> None:
    """200 present, 503 unknown, nothing listening unknown; 404 would be absent."""
    c = cap([{"kind": "http", "url": f"http://127.0.0.1:{server.port}/health?n={{note}}"}])
    assert (await verify_post_write_effects(c, P)).verdict == "verified"
    server.healthy = False
    assert (await verify_post_write_effects(c, P)).verdict == "unknown"
    down = cap([{"kind": "http", "url": f"http://127.0.0.1:{free_port}/"}])
    assert (await verify_post_write_effects(down, P)).verdict == "unknown"


async def test_http_effect_json_field(http_server: Any) -> None:
    """A JSON field compared with a substituted value."""
    c = cap([{"kind": "http", "url": f"{http_server.url}/health", "json_field": "ok",
              "json_equals": True}])
    assert (await verify_post_write_effects(c, P)).verdict == "verified"
    http_server.healthy = False
    # 503 is not the expected status: cannot decide
    assert (await verify_post_write_effects(c, P)).verdict == "unknown"


async def test_command_effect(vault: Path) -> None:
    """Exit 0 present, 1 absent, anything else unknown."""
    present = cap([{"kind": "command", "argv": ["grep", "-qxFe", "{line}", "{vault}/{note}.md"]}],
                  vault=str(vault))
    assert (await verify_post_write_effects(present, P)).verdict == "verified"
    assert (await verify_post_write_effects(present, Note(note="today", line="x"))
            ).verdict == "absent"
    assert (await verify_post_write_effects(present, Note(note="none", line="x"))
            ).verdict == "unknown"  # grep exits 2 on a missing file


@op("test.verify_note")
def verify_note(params: Note, **_: Any) -> bool | None:
    return {"yes": True, "no": False}.get(params.line)


async def test_op_effect() -> None:
    """A verify op answers True, False or None (unknown)."""
    table = OpTable()
    spec = verify_note.__capd_op__  # type: ignore[attr-defined]
    assert isinstance(spec, OpSpec)
    table.ops[spec.id] = spec
    c = cap([{"kind": "op", "op": "test.verify_note"}])
    for line, verdict in [("yes", "verified"), ("no", "absent"), ("maybe", "unknown")]:
        result = await verify_post_write_effects(c, Note(note="n", line=line), table)
        assert result.verdict == verdict


async def test_partial_when_some_effects_are_present(vault: Path) -> None:
    """One effect present and one absent: partial."""
    c = cap([{"kind": "file_exists", "path": "{vault}/{note}.md"},
             {"kind": "file_contains", "path": "{vault}/{note}.md", "line": "{line}"}],
            vault=str(vault))
    result = await verify_post_write_effects(c, Note(note="today", line="- eggs"))
    assert result.verdict == "partial"


def test_combine() -> None:
    """The verdict table."""
    assert combine(["present", "present"]) == "verified"
    assert combine(["absent", "absent"]) == "absent"
    assert combine(["present", "absent"]) == "partial"
    assert combine(["present", "unknown"]) == "unknown"
    assert combine([]) == "unknown"


async def test_a_parameter_in_an_http_effect_url_is_percent_encoded() -> None:
    """A call's parameter fills a path segment's worth of the URL, never a host, a port, a
    path or a query of its own; the capability's options are taken as written."""
    from aiohttp import web

    from capd.recovery._effects import _http
    from capd.registry import HttpEffect

    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.raw_path)
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        effect = HttpEffect(url=f"http://127.0.0.1:{port}/{{prefix}}/{{tenant}}")
        status, _ = await _http(effect, {"prefix": "v1/records", "tenant": "x/../admin?all=1#"},
                                {"prefix": "v1/records"})
    finally:
        await runner.cleanup()
    # "=" may stand in a path segment: the client sends it as itself
    assert seen == ["/v1/records/x%2F..%2Fadmin%3Fall=1%23"]
    assert status == "absent"
