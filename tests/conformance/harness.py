"""The official MCP conformance suite, run against a server over streamable HTTP.

The suite is ``@modelcontextprotocol/conformance`` (pinned in tests/npm/package-lock.json
with the Node 22 it needs, ``node@22``; .ci/deps installs both with ``npm ci``). Its
server mode connects to a URL as an MCP client and runs one scenario after another::

    node .../conformance/dist/index.js server --url URL --suite all -o OUT

and writes each scenario's checks to ``OUT/server-<scenario>-<timestamp>/checks.json``.
This module finds Node and the suite, starts the reference server
(tests/conformance/reference_server.py) as a subprocess, runs the suite, and reads its
per-scenario results; any MCP front door with a URL can be pointed at the same suite.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

ROOT = Path(__file__).resolve().parent.parent.parent
NPM = ROOT / "tests" / "npm" / "node_modules"
NODE = NPM / "node" / "bin" / "node"
SUITE_PACKAGE = NPM / "@modelcontextprotocol" / "conformance"
SUITE_VERSION = "0.1.16"
SERVER_SCENARIOS = 32  # what `conformance list --server` names in SUITE_VERSION
NODE_MAJOR = 22  # the suite calls fs.globSync, new in Node 22
REFERENCE_SERVER = Path(__file__).resolve().parent / "reference_server.py"

SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
SUITE_TIMEOUT_S = 600.0
LIST_TIMEOUT_S = 60.0

Status = Literal["SUCCESS", "FAILURE", "WARNING", "INFO", "SKIPPED"]
# server-<scenario>-<ISO time with ':' and '.' made '-'>, as the suite names a result folder
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z$")
LISTED_SCENARIO = re.compile(r"^\s+-\s+(?P<name>\S+)(?:\s+\[[^\]]*\])?\s*$")


class HarnessError(RuntimeError):
    """The suite or the server under test could not be run (not: a scenario failed)."""


def why_absent() -> str | None:
    """Why the suite cannot run on this machine, or None when it can."""
    if not NODE.is_file():
        return ("node@22 is not installed in tests/npm/node_modules "
                "(.ci/deps runs npm ci there)")
    try:
        version = subprocess.run([str(NODE), "--version"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"tests/npm's node does not run: {exc}"
    if int(version.lstrip("v").split(".")[0]) < NODE_MAJOR:
        return f"tests/npm's node is {version}; the conformance suite needs Node {NODE_MAJOR}+"
    manifest = SUITE_PACKAGE / "package.json"
    if not manifest.is_file():
        return ("@modelcontextprotocol/conformance is not installed in tests/npm "
                "(.ci/deps runs npm ci there)")
    installed = json.loads(manifest.read_text())["version"]
    if installed != SUITE_VERSION:
        return (f"@modelcontextprotocol/conformance {installed} is installed in tests/npm, "
                f"not the pinned {SUITE_VERSION} (.ci/deps runs npm ci there)")
    return None


def suite_command(*args: str) -> list[str]:
    """The argv that runs the suite's CLI with ``args`` under tests/npm's Node."""
    entry = json.loads((SUITE_PACKAGE / "package.json").read_text())["bin"]["conformance"]
    return [str(NODE), str(SUITE_PACKAGE / entry), *args]


def suite_env() -> dict[str, str]:
    """This process's environment with tests/npm's Node first on PATH (whatever the suite
    spawns runs under Node 22 too)."""
    return {**os.environ, "PATH": f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def list_server_scenarios(timeout_s: float = LIST_TIMEOUT_S) -> list[str]:
    """Every server scenario the installed suite has (``conformance list --server``).

    Raises HarnessError when the listing fails or names none.
    """
    try:
        done = subprocess.run(suite_command("list", "--server"), capture_output=True, text=True,
                              env=suite_env(), timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"conformance list took over {timeout_s} s") from exc
    names = [m["name"] for line in done.stdout.splitlines()
             if (m := LISTED_SCENARIO.match(line))]
    if done.returncode != 0 or not names:
        raise HarnessError(f"conformance list --server exited {done.returncode} listing "
                           f"{len(names)} scenarios: {done.stderr.strip()[-2000:]}")
    return names


@dataclass(frozen=True)
class Check:
    """One check of a scenario, as the suite's checks.json records it."""

    id: str
    status: Status
    description: str
    error_message: str | None = None


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's checks; it passes when none failed, as the suite counts it."""

    scenario: str
    checks: tuple[Check, ...]

    def count(self, status: Status) -> int:
        return sum(check.status == status for check in self.checks)

    @property
    def passed(self) -> bool:
        return self.count("FAILURE") == 0

    def describe(self) -> str:
        """One line (``✓ name: 1 passed, 0 failed, 2 warnings``), then one per failed
        check with its message."""
        mark = "✓" if self.passed else "✗"
        lines = [f"{mark} {self.scenario}: {self.count('SUCCESS')} passed, "
                 f"{self.count('FAILURE')} failed, {self.count('WARNING')} warnings"]
        lines += [f"    [{check.id}] {check.description}: {check.error_message or ''}"
                  for check in self.checks if check.status == "FAILURE"]
        return "\n".join(lines)


@dataclass(frozen=True)
class SuiteRun:
    """What one run of the suite's server mode produced."""

    url: str
    returncode: int
    stdout: str
    stderr: str
    results: Mapping[str, ScenarioResult]

    @property
    def failed(self) -> list[ScenarioResult]:
        return [result for result in self.results.values() if not result.passed]

    def report(self) -> str:
        """Every scenario's line, the count passed, and the tail of the suite's stderr
        when it exited non-zero."""
        lines = [result.describe() for result in self.results.values()]
        passing = len(self.results) - len(self.failed)
        lines.append(f"{passing} of {len(self.results)} scenarios passed against {self.url} "
                     f"(suite exited {self.returncode})")
        if self.returncode != 0 and self.stderr.strip():
            lines.append("suite stderr (tail):\n" + self.stderr.strip()[-3000:])
        return "\n".join(lines)


def read_checks(path: Path) -> tuple[Check, ...]:
    """The checks of one checks.json."""
    return tuple(Check(id=str(raw.get("id", "")), status=raw.get("status", "FAILURE"),
                       description=str(raw.get("description", "")),
                       error_message=raw.get("errorMessage"))
                 for raw in json.loads(path.read_text()))


def read_results(out_dir: Path, scenarios: list[str]) -> dict[str, ScenarioResult]:
    """Each of ``scenarios``' results from the suite's output folder, in that order.

    A scenario whose run threw writes no checks.json: it gets one failed check saying so
    (the suite's stdout has the error).
    """
    found: dict[str, Path] = {}
    for folder in sorted(out_dir.iterdir()):
        match = RESULT_DIR.match(folder.name)
        if match and (folder / "checks.json").is_file():
            found[match["scenario"]] = folder / "checks.json"  # the latest run wins
    results: dict[str, ScenarioResult] = {}
    for scenario in scenarios:
        if scenario in found:
            checks = read_checks(found[scenario])
        else:
            checks = (Check(id=scenario, status="FAILURE", description="scenario ran",
                            error_message="no checks.json: the scenario threw (see the "
                                          "suite's stdout)"),)
        results[scenario] = ScenarioResult(scenario, checks)
    return results


def run_suite(url: str, out_dir: Path, *, scenarios: list[str] | None = None,
              timeout_s: float = SUITE_TIMEOUT_S) -> SuiteRun:
    """Run the suite's server scenarios against the MCP endpoint ``url``.

    ``scenarios`` None runs every server scenario (``--suite all``); a list runs those one
    by one. Results are read from ``out_dir``. A scenario that fails is a result, not an
    exception; raises HarnessError when the suite cannot be listed or overruns
    ``timeout_s`` (it is killed then).
    """
    names = scenarios if scenarios is not None else list_server_scenarios()
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [["--suite", "all"]] if scenarios is None else [["--scenario", s] for s in names]
    deadline = time.monotonic() + timeout_s
    codes: list[int] = []
    stdout: list[str] = []
    stderr: list[str] = []
    for selection in runs:
        remaining = deadline - time.monotonic()
        try:
            done = subprocess.run(
                suite_command("server", "--url", url, *selection, "-o", str(out_dir)),
                capture_output=True, text=True, env=suite_env(), timeout=max(remaining, 1.0),
                check=False)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"the conformance suite ran over {timeout_s} s against {url}; "
                               f"its output so far:\n{_text(exc.stdout)[-3000:]}") from exc
        codes.append(done.returncode)
        stdout.append(done.stdout)
        stderr.append(done.stderr)
    return SuiteRun(url=url, returncode=max(codes, key=abs), stdout="".join(stdout),
                    stderr="".join(stderr), results=read_results(out_dir, names))


def _text(data: str | bytes | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


@dataclass(frozen=True)
class RunningServer:
    """A server subprocess and the MCP endpoint it announced."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path


def read_announcement(stream: IO[bytes], timeout_s: float) -> str:
    """The first line ``stream`` carries, waiting at most ``timeout_s``.

    Raises HarnessError on timeout or when the stream ends first.
    """
    deadline = time.monotonic() + timeout_s
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                raise HarnessError(f"no announcement within {timeout_s} s")
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                raise HarnessError(f"the process closed its stdout first ({buffer!r})")
            buffer += chunk
    return buffer.split(b"\n", 1)[0].decode()


def stop_process(process: subprocess.Popen[bytes],
                 timeout_s: float = SERVER_STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``; always reaped."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)
    if process.stdout is not None:
        process.stdout.close()


@contextmanager
def reference_server(log: Path, *, port: int = 0,
                     start_timeout_s: float = SERVER_START_TIMEOUT_S) -> Iterator[RunningServer]:
    """The reference server running as a subprocess on 127.0.0.1:``port`` (0: a free port
    it picks and announces), its stderr in ``log``; stopped on exit.

    Raises HarnessError when it does not announce its URL within ``start_timeout_s``.
    """
    with log.open("wb") as errors:
        process = subprocess.Popen(
            [sys.executable, str(REFERENCE_SERVER), "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, cwd=ROOT,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    try:
        assert process.stdout is not None
        try:
            line = read_announcement(process.stdout, start_timeout_s)
        except HarnessError as exc:
            raise HarnessError(f"the reference server did not start: {exc}; "
                               f"its stderr:\n{log.read_text(errors='replace')[-3000:]}") from exc
        kind, _, url = line.partition(" ")
        if kind != "listening" or not url.startswith("http://127.0.0.1:"):
            raise HarnessError(f"the reference server announced {line!r}")
        yield RunningServer(url=url, process=process, log=log)
    finally:
        stop_process(process)
