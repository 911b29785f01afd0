"""Upstream MCP servers the daemon runs: the ``[tools.X]`` table of a script as a stdio
server, and a plain daemon configuration for them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PY = sys.executable


def stdio_tool(folder: Path, tool: str, source: str, *args: str, **settings: object) -> str:
    """Write ``source`` as ``<tool>.py`` in ``folder``; the ``[tools.<tool>]`` table that
    runs it as a stdio MCP server (``timeout_s`` 30 unless ``settings`` say otherwise)."""
    script = folder / f"{tool}.py"
    script.write_text(source)
    argv = json.dumps([PY, str(script), *args])
    lines = [f"[tools.{tool}]", 'kind = "mcp"', f"command = {argv}",
             *(f"{key} = {json.dumps(value)}"
               for key, value in {"timeout_s": 30, **settings}.items())]
    return "\n" + "\n".join(lines) + "\n"


def upstream_config(folder: Path, extra: str = "") -> Path:
    """A capd.toml for upstream servers only (``extra`` appended): fast rechecks."""
    config = folder / "capd.toml"
    config.write_text("""
entry_points = false
state_dir = "state"
recheck_cooldown_s = 0
recheck_interval_s = 0.5
probe_live_interval_s = 1
retry_base_s = 0.2
""" + extra)
    return config
