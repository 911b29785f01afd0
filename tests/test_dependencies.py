"""What capd takes from its dependencies beyond their public API is still there: a test
fails the day an upgrade moves it (each such dependency also has an upper bound), and
every package capd imports is declared."""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import inspect
import sys
from pathlib import Path

import aiosqlite
import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

ROOT = Path(__file__).parent.parent

# import name -> distribution
DISTRIBUTIONS = {
    "Stemmer": "PyStemmer", "yaml": "PyYAML", "mcp_types": "mcp-types",
    "prometheus_client": "prometheus-client", "pydantic_settings": "pydantic-settings",
    "psycopg_pool": "psycopg-pool", "opentelemetry": "opentelemetry-sdk",
}
OPTIONAL = {"psycopg", "psycopg-pool", "opentelemetry-sdk"}  # extras: postgres, otel


async def test_aiosqlite_still_has_the_queue_and_connection_group_commit_reads(
        tmp_path: Path) -> None:
    """recovery/_group_commit.py puts work on aiosqlite's own thread queue (``_tx``) and
    runs it on the thread's sqlite3 connection (``_conn``)."""
    db = await aiosqlite.connect(tmp_path / "x.db")
    try:
        assert hasattr(db._tx, "put")
        assert db._conn is not None
    finally:
        await db.close()


def test_uvicorns_h11_protocol_keeps_what_the_front_doors_guard_overrides() -> None:
    """sidecar/server/_door_guard.py subclasses H11Protocol: these hooks and the cycle's
    ``response_complete`` are what it reads and overrides."""
    for name in ("connection_made", "connection_lost", "data_received",
                 "on_response_complete"):
        assert callable(getattr(H11Protocol, name))
    assert "response_complete" in inspect.getsource(RequestResponseCycle.__init__)
    assert "self.cycle" in inspect.getsource(H11Protocol.handle_events)
    assert "self.client" in inspect.getsource(H11Protocol.connection_made)
    assert asyncio.iscoroutinefunction(__import__("uvicorn").Server.serve)


def _imported() -> set[str]:
    names: set[str] = set()
    for folder in ("sidecar", "registry", "recovery"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "capd"}


def test_every_package_capd_imports_is_declared() -> None:
    """Each third-party import of the package is a declared dependency (or an extra's)."""
    declared = " ".join(importlib.metadata.requires("capd") or []).lower()
    missing = []
    for name in sorted(_imported()):
        distribution = DISTRIBUTIONS.get(name, name).lower()
        if distribution not in declared:
            missing.append(f"{name} ({distribution})")
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


@pytest.mark.parametrize("distribution", ["aiosqlite", "uvicorn"])
def test_the_pinned_dependencies_have_an_upper_bound(distribution: str) -> None:
    """A dependency whose private names capd uses is bounded above."""
    lines = [r for r in importlib.metadata.requires("capd") or []
             if r.lower().startswith(distribution)]
    assert lines
    assert any("<" in line for line in lines), lines
