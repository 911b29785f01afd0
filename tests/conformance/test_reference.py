"""The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in
tests/npm) passes every server scenario against our reference server, started as a real
subprocess on a free port; and the harness reports a scenario that fails as failed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conformance.harness import (
    SERVER_SCENARIOS,
    list_server_scenarios,
    read_results,
    reference_server,
    run_suite,
    why_absent,
)

ABSENT = why_absent()
needs_suite = pytest.mark.skipif(ABSENT is not None, reason=ABSENT or "")
pytestmark = pytest.mark.slow  # real Node 22 suite runs against real server subprocesses


@needs_suite
def test_the_pinned_suite_lists_every_server_scenario() -> None:
    """The installed suite names the server scenarios its pinned version has."""
    scenarios = list_server_scenarios()
    assert len(scenarios) == SERVER_SCENARIOS, scenarios
    assert len(set(scenarios)) == len(scenarios)
    assert {"server-initialize", "tools-call-with-progress", "resources-subscribe",
            "dns-rebinding-protection"} <= set(scenarios)


@needs_suite
def test_every_server_scenario_passes_against_the_reference_server(tmp_path: Path) -> None:
    """All server scenarios of the pinned suite pass against the reference server."""
    with reference_server(tmp_path / "server.log") as server:
        run = run_suite(server.url, tmp_path / "results")
        assert server.process.poll() is None, "the reference server died during the suite"
    print(run.report())
    assert len(run.results) == SERVER_SCENARIOS, run.report()
    assert run.failed == [], run.report()
    assert run.returncode == 0, run.report()
    # the scenarios that check more than one thing checked them all
    assert run.results["json-schema-2020-12"].count("SUCCESS") == 4, run.report()
    assert run.results["elicitation-sep1034-defaults"].count("SUCCESS") == 5, run.report()
    assert run.results["elicitation-sep1330-enums"].count("SUCCESS") == 5, run.report()
    assert run.results["dns-rebinding-protection"].count("SUCCESS") == 2, run.report()


@needs_suite
def test_a_scenario_against_nothing_is_reported_failed(tmp_path: Path) -> None:
    """Pointed at a port nothing listens on, the suite's scenarios fail, and the harness
    says which with the suite's message."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = run_suite(f"http://127.0.0.1:{port}/mcp", tmp_path / "results",
                    scenarios=["ping", "tools-list"])
    assert [result.scenario for result in run.failed] == ["ping", "tools-list"], run.report()
    assert run.returncode != 0
    failure = next(c for c in run.results["ping"].checks if c.status == "FAILURE")
    assert failure.error_message, run.report()
    assert "0 of 2 scenarios passed" in run.report()


def test_a_scenario_that_wrote_no_checks_counts_as_failed(tmp_path: Path) -> None:
    """A scenario whose run threw leaves no checks.json: its result is one failed check."""
    ok = tmp_path / "server-ping-2026-01-02T03-04-05-678Z"
    ok.mkdir()
    (ok / "checks.json").write_text(json.dumps(
        [{"id": "ping", "status": "SUCCESS", "description": "pong"}]))
    results = read_results(tmp_path, ["ping", "tools-list"])
    assert results["ping"].passed
    assert not results["tools-list"].passed
    assert "no checks.json" in (results["tools-list"].checks[0].error_message or "")


def test_warnings_alone_do_not_fail_a_scenario(tmp_path: Path) -> None:
    """As the suite counts it, a scenario passes unless a check failed: warnings and
    informational checks (server-sse-polling has only those) do not fail it."""
    folder = tmp_path / "server-server-sse-polling-2026-01-02T03-04-05-678Z"
    folder.mkdir()
    (folder / "checks.json").write_text(json.dumps([
        {"id": "server-sse-priming-event", "status": "WARNING", "description": "priming",
         "errorMessage": "no priming event"},
        {"id": "stream-closed", "status": "INFO", "description": "closed"}]))
    result = read_results(tmp_path, ["server-sse-polling"])["server-sse-polling"]
    assert result.passed
    assert result.count("WARNING") == 1
