"""capd's registry: the capability model, tool probes, ops and hooks, declarations and the build.

It knows nothing of sockets, SQLite or the daemon.

Its exceptions, in four trees::

    CapdError                     root of every error capd raises on purpose (``_errors``)
    └── RegistryError
        ├── DeclarationError      a capability declaration (TOML or code) is invalid
        ├── PluginError           a plugin module could not be imported
        ├── ConfigError           the build configuration is unusable
        ├── UnknownCapability     a lookup named a capability that does not exist (LookupError)
        ├── UnknownTopology       a lookup named a topology that is not declared (LookupError)
        └── InvalidTopology       a topology fails validation; every problem is listed

    ValueError
    └── TemplateError             a ``{name}`` template is malformed, unsafe or lacks a value
                                  (``_template``); loading declarations turns it into a
                                  DeclarationError, the daemon's config into a ConfigError

    ToolError                     what an op raises to say how its call went (``_outcomes``)
    ├── ToolUnavailable           its tool is down: transient, and the capability is disabled
    ├── TransientToolError        try again later (optionally after ``retry_after_s``)
    ├── PermanentToolError        retrying will not help
    └── Blocked                   a policy refused the call

    Exception
    └── ProbeFailed               internal (``_probes``): the tool answered, but not as
                                  expected; it never leaves :func:`run_probe`, which
                                  reports it as a failed :class:`ProbeResult`

The gateway and the sweep read a :class:`ToolError` as the outcome of a call,
never as a failure of capd. The recovery and sidecar packages hang their own
subtrees off :class:`CapdError`. Where an exception is translated (a
``ValidationError`` or a ``TemplateError`` into a ``DeclarationError``, an
import failure into a ``PluginError``), the original is kept as its
``__cause__``.
"""

from typing import TYPE_CHECKING, Any

from ._agents import AgentSpec, InjectionSpec, Selection, select_capabilities
from ._assemble import model_assembler
from ._build import BuildConfig, build
from ._declarations import (
    DeclarationSet,
    describe_validation_error,
    load_declarations,
    load_topologies,
    parse_tool,
    render_vars,
)
from ._errors import (
    CapdError,
    ConfigError,
    DeclarationError,
    InvalidTopology,
    PluginError,
    RegistryError,
    UnknownCapability,
    UnknownTopology,
)
from ._hooks import HookSpec, after_call, before_call
from ._model import (
    SAFETY_LEVELS,
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
    McpProbe,
    OpEffect,
    PartialReplay,
    PathProbe,
    ProbeResult,
    PythonProbe,
    RetryPolicy,
    Safety,
    TcpProbe,
    ToolSpec,
    UnixProbe,
    estimate_tokens,
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
from ._routes import ErrorRoute
from ._schema import parameters_schema
from ._template import TemplateError, placeholders, render
from ._threads import OpThreads, Running, ThreadHandle
from ._topology import (
    Topology,
    TopologyExpansion,
    TopologyGroup,
    TopologyPhase,
    TopologyRole,
    TopologySet,
    expand_topology,
    parse_count_overrides,
    validate_topology,
)
from ._upstream import Upstream, UpstreamError, UpstreamPool

__all__ = [
    "SAFETY_LEVELS",
    "AgentSpec",
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
    "ErrorRoute",
    "FileContainsEffect",
    "FileExistsEffect",
    "Hit",
    "HookSpec",
    "HostRequirements",
    "HttpEffect",
    "HttpProbe",
    "InjectionSpec",
    "InvalidTopology",
    "LatencyClass",
    "McpProbe",
    "OpEffect",
    "OpSpec",
    "OpTable",
    "OpThreads",
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
    "Running",
    "Safety",
    "SearchIndex",
    "Selection",
    "TcpProbe",
    "TemplateError",
    "ThreadHandle",
    "ToolError",
    "ToolSpec",
    "ToolUnavailable",
    "Topology",
    "TopologyExpansion",
    "TopologyGroup",
    "TopologyPhase",
    "TopologyRole",
    "TopologySet",
    "TransientToolError",
    "UnixProbe",
    "UnknownCapability",
    "UnknownTopology",
    "Upstream",
    "UpstreamError",
    "UpstreamPool",
    "after_call",
    "before_call",
    "build",
    "capability",
    "describe_validation_error",
    "estimate_tokens",
    "expand_topology",
    "is_valid_name",
    "load_declarations",
    "load_plugins",
    "load_topologies",
    "model_assembler",
    "op",
    "parameters_schema",
    "parse_count_overrides",
    "parse_tool",
    "placeholders",
    "probe_all",
    "render",
    "render_vars",
    "run_probe",
    "select_capabilities",
    "success_boost",
    "tokenize",
    "validate_topology",
]


# The search stack (numpy, the tokenizer, the embedding model) is imported when a search
# name is first used, not with the package: `capd call` and the other client commands do
# not pay for it.
_LAZY = {"Hit", "SearchIndex", "success_boost", "tokenize"}

if TYPE_CHECKING:
    from ._search import Hit, SearchIndex, success_boost, tokenize


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import _search

        value = getattr(_search, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
