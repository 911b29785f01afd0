"""The public surface of each package changes only on purpose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capd import recovery, registry, sidecar
from capd.sidecar import client, server

REGISTRY = {
    "OpThreads", "Running", "ThreadHandle", "model_assembler",
    "BuildConfig", "CapabilitySpec", "Capability", "CapdError", "CommandEffect", "CommandProbe",
    "ConfigError", "DeclarationError", "DeclarationSet", "DisabledEntry", "EffectSpec",
    "FileContainsEffect", "FileExistsEffect", "HttpEffect", "HttpProbe", "LatencyClass",
    "OpEffect", "OpSpec", "OpTable", "PartialReplay", "PathProbe", "PluginError", "Probe",
    "ProbeResult", "PythonProbe", "McpProbe", "Upstream", "UpstreamError", "UpstreamPool",
    "Registry", "RegistryError", "RegistrySnapshot", "RetryPolicy", "SAFETY_LEVELS", "Safety",
    "USER_CODE_FAILURES",
    "TcpProbe", "TemplateError", "ToolSpec", "UnixProbe", "UnknownCapability", "build",
    "capability", "is_valid_name", "ALIAS_MARK", "is_valid_alias", "is_valid_reference",
    "without_mark", "load_declarations", "load_plugins", "op",
    "parameters_schema", "placeholders", "probe_all", "render", "run_probe",
    "Blocked", "Partial", "PermanentToolError", "ToolAnswer", "ToolError", "ToolUnavailable",
    "TransientToolError", "Hit", "HostRequirements", "SearchIndex", "estimate_tokens",
    "success_boost", "tokenize", "describe_validation_error", "parse_tool", "render_vars",
    "ErrorRoute", "HookSpec", "after_call", "before_call",
    "AgentSpec", "InjectionSpec", "Selection", "select_capabilities",
    "Topology", "TopologyExpansion", "TopologyGroup", "TopologyPhase", "TopologyRole",
    "TopologySet", "InvalidTopology", "UnknownTopology", "expand_topology", "load_topologies",
    "parse_count_overrides", "validate_topology",
    "GuardedHttp", "GuardedResponse", "guarded_fetch", "NetGuard", "NetGuardError",
    "SsrfRefused", "HttpLimitExceeded", "HttpUnreachable", "HttpTimeout", "UrlHost",
    "classify_address", "read_url",
    # what a call in progress tells its caller (progress, questions), and upstreams'
    # resources and prompts and their refresh
    "CALL_EVENTS", "CallEvents", "CannotAsk", "current_events", "UnknownOffer",
    "contents_as_json", "refresh_upstream", "undescribed_parameters", "AgentServer",
    "CallerHost", "HostCaps",
}


def test_registry_exports() -> None:
    """registry.__all__ is exactly the pinned set and every name resolves."""
    assert set(registry.__all__) == REGISTRY
    for name in registry.__all__:
        assert getattr(registry, name) is not None


SIDECAR = {
    "COMMANDS", "BadRequest", "DaemonDown", "DaemonUnreachable", "Draining", "Forbidden",
    "InvalidParams",
    "McpTool", "OperatorCommand", "SidecarError", "SocketInUse", "StateDirLocked",
    "UnsafeSocketFolder", "capd_version", "default_socket_path", "UnknownAgent",
    "UnresolvedAgent",
}

SERVER = {
    "Caller", "CapdConfig", "Daemon", "Gateway", "LoadedConfig", "Services", "ToolResult",
    "ToolResultStatus", "load_config", "run_daemon",
}

CLIENT = {"Response", "main", "request"}

RECOVERY = {
    "DEFAULT_COOLDOWN_S", "JOB_STATES", "Attempt", "BackoffPolicy", "CallKind", "CallOutcome",
    "CapabilityRecheck", "EffectCheck", "EffectStatus", "EnqueueRequest", "IdempotencyConflict",
    "InvalidTransition", "Job", "JobQueue", "JobState", "PgRetryQueue", "QueueClosed",
    "QueueCorrupt", "QueueError",
    "QueueFull", "QueueStats", "QueueStorageError", "RecheckStats", "Rechecker", "RecoveryError",
    "RetryQueue", "RetrySweep", "RunningAttempts", "ToolRecheck", "UnknownJob", "UnknownTool",
    "Verdict",
    "Verification", "apply_passive_health", "call_capability", "check_effect",
    "classify_error", "combine",
    "deadline",
    "default_state_dir",
    "tracing",
    "verify_post_write_effects",
}


def test_sidecar_and_recovery_exports() -> None:
    """sidecar and recovery export exactly the pinned names, all resolvable."""
    assert set(sidecar.__all__) == SIDECAR
    assert set(server.__all__) == SERVER
    assert set(client.__all__) == CLIENT
    assert set(recovery.__all__) == RECOVERY
    for module in (sidecar, server, client, recovery):
        for name in module.__all__:
            assert getattr(module, name) is not None


ROOT = Path(__file__).resolve().parent.parent


def _imported_after(code: str) -> set[str]:
    """The capd modules a fresh interpreter has loaded after running ``code``."""
    probe = (f"{code}\nimport sys\n"
             "print('\\n'.join(m for m in sys.modules if m.split('.')[0] in "
             "('capd', 'registry', 'recovery', 'sidecar')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd="/")
    return set(done.stdout.split())


@pytest.mark.slow
def test_the_client_never_imports_the_server() -> None:
    """`capd call` / `capd mcp` load the client side only: no server module is imported."""
    loaded = _imported_after("import capd.sidecar.client, capd.sidecar.client._mcp")
    assert "capd.sidecar.client.cli" in loaded
    assert not {m for m in loaded if m.startswith("capd.sidecar.server")}, loaded


@pytest.mark.slow
def test_capd_is_the_only_installed_name() -> None:
    """From outside the checkout, capd.* imports and the bare folder names do not."""
    loaded = _imported_after("import capd.registry, capd.sidecar, capd.recovery")
    assert {"capd.registry", "capd.sidecar", "capd.recovery"} <= loaded
    for bare in ("registry", "sidecar", "recovery"):
        done = subprocess.run([sys.executable, "-c", f"import {bare}"], capture_output=True,
                              text=True, check=False, cwd="/")
        assert done.returncode == 1, f"`import {bare}` worked: {done.stdout}"
        assert "ModuleNotFoundError" in done.stderr


def test_no_code_imports_a_bare_package_name() -> None:
    """Inside the tree every import says capd.*: a bare `registry` would load a second copy."""
    import re

    bare = re.compile(r"^\s*(from|import) (registry|recovery|sidecar)\b", re.M)
    offenders = [str(path.relative_to(ROOT))
                 for folder in ("registry", "recovery", "sidecar", "tests", "bench", "examples")
                 for path in (ROOT / folder).rglob("*.py") if bare.search(path.read_text())]
    assert offenders == []
