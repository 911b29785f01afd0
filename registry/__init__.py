"""capd's registry: the capability model, tool probes, ops, declarations and the build.

It knows nothing of sockets, SQLite or the daemon.
"""

from ._build import BuildConfig, build
from ._declarations import DeclarationSet, load_declarations
from ._errors import (
    CapdError,
    ConfigError,
    DeclarationError,
    PluginError,
    RegistryError,
    UnknownCapability,
)
from ._model import (
    Capability,
    CommandEffect,
    CommandProbe,
    EffectSpec,
    FileContainsEffect,
    FileExistsEffect,
    HostRequirements,
    HttpEffect,
    HttpProbe,
    LatencyClass,
    OpEffect,
    PartialReplay,
    PathProbe,
    ProbeResult,
    PythonProbe,
    RetryPolicy,
    TcpProbe,
    ToolSpec,
    UnixProbe,
    is_valid_name,
)
from ._ops import CapabilitySpec, OpSpec, OpTable, capability, load_plugins, op
from ._outcomes import (
    Blocked,
    Partial,
    PermanentToolError,
    ToolError,
    ToolUnavailable,
    TransientToolError,
)
from ._probes import Probe, probe_all, run_probe
from ._registry import DisabledEntry, Registry, RegistrySnapshot
from ._schema import parameters_schema
from ._search import Hit, SearchIndex, estimate_tokens, success_boost, tokenize
from ._template import TemplateError, placeholders, render

__all__ = [
    "Blocked",
    "BuildConfig",
    "Capability",
    "CapabilitySpec",
    "CapdError",
    "CommandEffect",
    "CommandProbe",
    "ConfigError",
    "DeclarationError",
    "DeclarationSet",
    "DisabledEntry",
    "EffectSpec",
    "FileContainsEffect",
    "FileExistsEffect",
    "Hit",
    "HostRequirements",
    "HttpEffect",
    "HttpProbe",
    "LatencyClass",
    "OpEffect",
    "OpSpec",
    "OpTable",
    "Partial",
    "PartialReplay",
    "PathProbe",
    "PermanentToolError",
    "PluginError",
    "Probe",
    "ProbeResult",
    "PythonProbe",
    "Registry",
    "RegistryError",
    "RegistrySnapshot",
    "RetryPolicy",
    "SearchIndex",
    "TcpProbe",
    "TemplateError",
    "ToolError",
    "ToolSpec",
    "ToolUnavailable",
    "TransientToolError",
    "UnixProbe",
    "UnknownCapability",
    "build",
    "capability",
    "estimate_tokens",
    "is_valid_name",
    "load_declarations",
    "load_plugins",
    "op",
    "parameters_schema",
    "placeholders",
    "probe_all",
    "render",
    "run_probe",
    "success_boost",
    "tokenize",
]
