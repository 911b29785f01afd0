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


def test_sidecar_and_recovery_exports() -> None:
    """sidecar and recovery export what they say, and nothing unresolvable."""
    for module in (sidecar, recovery):
        for name in module.__all__:
            assert getattr(module, name) is not None
    assert set(sidecar.__all__) >= {"CapdConfig", "LoadedConfig", "load_config"}
