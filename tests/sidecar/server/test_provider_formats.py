"""Provider schemas: a capability's tool definition as OpenAI, Anthropic and MCP expect it.

Every capability of the bundled example is rendered in each format and compared with a
reviewed golden file (CAPD_UPDATE_GOLDEN=1 rewrites them); one capability is asked for
through the real daemon, over HTTP and with ``capd show --format``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from capd.registry import Capability, build, parameters_schema
from capd.sidecar._table import PROVIDER_FORMATS
from capd.sidecar._views import provider_name, provider_tool, strict_compatible
from capd.sidecar.server import load_config
from tests.helpers.daemon import DaemonProcess
from tests.helpers.servers import EXAMPLES, TESTS

GOLDEN = TESTS / "fixtures" / "provider_formats"


def _example_capabilities(example: Path) -> list[Capability]:
    loaded = load_config(example / "capd.toml")
    loaded.seed()
    registry = asyncio.run(build(loaded.build_config()))
    snap = registry.snapshot()
    caps = [*snap.live.values(), *(e.capability for e in snap.disabled.values())]
    return sorted(caps, key=lambda c: c.name)


@pytest.fixture(scope="module")
def example_caps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Capability]]:
    """Every capability of a private copy of the bundled example, live or disabled; the
    example's plugin is imported here, and sys.path and sys.modules are put back after."""
    folder = tmp_path_factory.mktemp("provider")
    shutil.copytree(EXAMPLES, folder / "example", ignore=shutil.ignore_patterns("__pycache__"))
    modules = set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAPD_STATE_DIR", str(folder / "state"))
        patch.setattr(sys, "path", list(sys.path))
        yield _example_capabilities(folder / "example")
    for name in set(sys.modules) - modules:
        if name == "notes_pack" or name.startswith("notes_pack."):
            del sys.modules[name]


@pytest.mark.parametrize("form", PROVIDER_FORMATS)
def test_example_renderings_match_golden(example_caps: list[Capability], form: str) -> None:
    """Each format's rendering of every example capability equals the reviewed golden file."""
    rendered = [provider_tool(cap, form) for cap in example_caps]
    assert len(rendered) == 5
    path = GOLDEN / f"{form}.json"
    if os.environ.get("CAPD_UPDATE_GOLDEN"):
        path.write_text(json.dumps(rendered, indent=2, sort_keys=True) + "\n")
    assert rendered == json.loads(path.read_text())


def test_openai_and_anthropic_names_map_dots() -> None:
    """A dot becomes a double underscore; a name past 64 characters is refused."""
    assert provider_name("notes.append") == "notes__append"
    assert provider_name("a-b.c_d") == "a-b__c_d"
    with pytest.raises(ValueError, match="not a valid provider tool name"):
        provider_name("a." + "b" * 63)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(description="Note name.")


class _Loose(BaseModel):
    note: str
    line: str | None = None


def test_strict_only_when_every_object_is_closed_and_fully_required() -> None:
    """strict is true only with additionalProperties false and every property required."""
    assert strict_compatible(parameters_schema(_Strict))
    assert not strict_compatible(parameters_schema(_Loose))
    closed = {"type": "object", "additionalProperties": False, "required": ["a"],
              "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}},
                                   "required": ["b"]}}}
    assert not strict_compatible(closed)  # the nested object is open
    closed["properties"]["a"]["additionalProperties"] = False  # type: ignore[index]
    assert strict_compatible(closed)
    assert strict_compatible({"type": "object", "additionalProperties": False,
                              "properties": {}})


def test_unknown_format_is_refused(example_caps: list[Capability]) -> None:
    with pytest.raises(ValueError, match="format must be openai, anthropic, mcp"):
        provider_tool(example_caps[0], "gemini")


# ------------------------------------------------------------------ through the daemon


@pytest.fixture
def example_daemon(example_copy: Path, short_tmp: Path) -> Iterator[DaemonProcess]:
    """The real daemon serving a private copy of the bundled example."""
    daemon = DaemonProcess(example_copy / "capd.toml", short_tmp / "capd.sock",
                           env={"CAPD_STATE_DIR": str(short_tmp / "state")})
    try:
        yield daemon.start().wait_ready()
    finally:
        daemon.kill()


def _golden(form: str, name: str) -> Any:
    """The golden rendering of capability ``name`` in ``form``."""
    wanted = name if form == "mcp" else provider_name(name)
    tools: list[dict[str, Any]] = json.loads((GOLDEN / f"{form}.json").read_text())
    (tool,) = [t for t in tools
               if (t["function"]["name"] if form == "openai" else t["name"]) == wanted]
    return tool


@pytest.mark.slow
def test_daemon_serves_each_format(example_daemon: DaemonProcess) -> None:
    """GET /capabilities/notes.append?format=... and `capd show --format` give the golden
    tool; an unknown format is a 422 naming the formats."""
    for form in PROVIDER_FORMATS:
        answer = example_daemon.call("GET", f"/capabilities/notes.append?format={form}")
        assert answer.status == 200, answer.body
        assert answer.body == _golden(form, "notes.append")
        shown = subprocess.run(
            [sys.executable, "-m", "capd", "show", "notes.append", "--format", form,
             "--socket", str(example_daemon.socket)],
            capture_output=True, text=True, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == _golden(form, "notes.append")
    bad = example_daemon.call("GET", "/capabilities/notes.append?format=gemini")
    assert bad.status == 422, bad.body
    assert "format: Input should be 'openai', 'anthropic' or 'mcp'" in bad.body["detail"]
    manifest = example_daemon.call("GET", "/capabilities/notes.append")
    assert manifest.status == 200
    assert manifest.body["name"] == "notes.append"
    assert "telemetry" in manifest.body
