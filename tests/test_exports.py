"""The public surface of each package changes only on purpose."""

from __future__ import annotations

import recovery
import registry
import sidecar

REGISTRY = {
    "BuildConfig", "CapabilitySpec", "Capability", "CapdError", "CommandEffect", "CommandProbe",
    "ConfigError", "DeclarationError", "DeclarationSet", "DisabledEntry", "EffectSpec",
    "FileContainsEffect", "FileExistsEffect", "HttpEffect", "HttpProbe", "LatencyClass",
    "OpEffect", "OpSpec", "OpTable", "PartialReplay", "PathProbe", "PluginError", "Probe",
    "ProbeResult", "PythonProbe", "Registry", "RegistryError", "RegistrySnapshot", "RetryPolicy",
    "TcpProbe", "TemplateError", "ToolSpec", "UnixProbe", "UnknownCapability", "build",
    "capability", "is_valid_name", "load_declarations", "load_plugins", "op",
    "parameters_schema", "placeholders", "probe_all", "render", "run_probe",
    "Blocked", "Partial", "PermanentToolError", "ToolError", "ToolUnavailable",
    "TransientToolError", "Hit", "HostRequirements", "SearchIndex", "estimate_tokens",
    "success_boost", "tokenize",
}


def test_registry_exports() -> None:
    """registry.__all__ is exactly the pinned set and every name resolves."""
    assert set(registry.__all__) == REGISTRY
    for name in registry.__all__:
        assert getattr(registry, name) is not None


SIDECAR = {
    "COMMANDS", "BadRequest", "Caller", "CapdConfig", "Daemon", "DaemonUnreachable", "Draining",
    "Gateway", "InvalidParams", "LoadedConfig", "McpTool", "OperatorCommand", "Option",
    "SidecarError", "SocketInUse", "StateDirLocked", "ToolResult", "ToolResultStatus",
    "UnsafeSocketFolder", "load_config",
}

RECOVERY = {
    "DEFAULT_COOLDOWN_S", "JOB_STATES", "Attempt", "BackoffPolicy", "CallKind", "CallOutcome",
    "CapabilityRecheck", "EffectCheck", "EffectStatus", "EnqueueRequest", "IdempotencyConflict",
    "InvalidTransition", "Job", "JobState", "QueueClosed", "QueueCorrupt", "QueueError",
    "QueueFull", "QueueStats", "QueueStorageError", "RecheckStats", "Rechecker", "RecoveryError",
    "RetryQueue", "RetrySweep", "RunningAttempts", "ToolRecheck", "UnknownJob", "UnknownTool",
    "Verdict",
    "Verification", "apply_passive_health", "call_capability", "check_effect",
    "classify_error", "combine",
    "default_state_dir",
    "verify_post_write_effects",
}


def test_sidecar_and_recovery_exports() -> None:
    """sidecar and recovery export exactly the pinned names, all resolvable."""
    assert set(sidecar.__all__) == SIDECAR
    assert set(recovery.__all__) == RECOVERY
    for module in (sidecar, recovery):
        for name in module.__all__:
            assert getattr(module, name) is not None
