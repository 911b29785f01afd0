"""capd's registry: the capability model, tool probes, ops and hooks, declarations and the build.

It knows nothing of sockets, SQLite or the daemon.

Its exceptions, in five trees::

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

    RegistryError
    └── NetGuardError             the network guard (``_netguard``) refused or failed:
        ├── SsrfRefused           also a Blocked: a URL or a redirect hop reaches inside
        ├── HttpLimitExceeded     also a PermanentToolError: too many redirects, too long a body
        ├── HttpUnreachable       also a ConnectionError: no connection (a network failure)
        └── HttpTimeout           also a TimeoutError: no answer within ``timeout_s``

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

import importlib
from typing import TYPE_CHECKING, Any

from ._agents import AgentSpec, InjectionSpec, Selection, select_capabilities
from ._assemble import model_assembler
from ._build import BuildConfig, build, refresh_upstream
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
from ._events import CALL_EVENTS, CallEvents, CannotAsk, current_events
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
from ._names import ALIAS_MARK, is_valid_alias, is_valid_reference, without_mark
from ._netguard import (
    HttpLimitExceeded,
    HttpTimeout,
    HttpUnreachable,
    NetGuard,
    NetGuardError,
    SsrfRefused,
    classify_address,
)
from ._ops import CapabilitySpec, OpSpec, OpTable, capability, load_plugins, op
from ._outcomes import (
    Blocked,
    Partial,
    PermanentToolError,
    ToolAnswer,
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
from ._upstream import (
    UnknownOffer,
    Upstream,
    UpstreamError,
    UpstreamPool,
    contents_as_json,
)
from ._urls import UrlHost, read_url

__all__ = [
    "ALIAS_MARK",
    "CALL_EVENTS",
    "SAFETY_LEVELS",
    "AgentSpec",
    "Blocked",
    "BuildConfig",
    "CallEvents",
    "CannotAsk",
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
    "GuardedHttp",
    "GuardedResponse",
    "Hit",
    "HookSpec",
    "HostRequirements",
    "HttpEffect",
    "HttpLimitExceeded",
    "HttpProbe",
    "HttpTimeout",
    "HttpUnreachable",
    "InjectionSpec",
    "InvalidTopology",
    "LatencyClass",
    "McpProbe",
    "NetGuard",
    "NetGuardError",
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
    "SsrfRefused",
    "TcpProbe",
    "TemplateError",
    "ThreadHandle",
    "ToolAnswer",
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
    "UnknownOffer",
    "UnknownTopology",
    "Upstream",
    "UpstreamError",
    "UpstreamPool",
    "UrlHost",
    "after_call",
    "before_call",
    "build",
    "capability",
    "classify_address",
    "contents_as_json",
    "current_events",
    "describe_validation_error",
    "estimate_tokens",
    "expand_topology",
    "guarded_fetch",
    "is_valid_alias",
    "is_valid_name",
    "is_valid_reference",
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
    "read_url",
    "refresh_upstream",
    "render",
    "render_vars",
    "run_probe",
    "select_capabilities",
    "success_boost",
    "tokenize",
    "validate_topology",
    "without_mark",
]


# The search stack (numpy, the tokenizer, the embedding model) and the guarded HTTP client
# (aiohttp) are imported when one of their names is first used, not with the package:
# `capd call`, the other client commands and the daemon's start do not pay for them.
_LAZY = {"Hit": "_search", "SearchIndex": "_search", "success_boost": "_search",
         "tokenize": "_search", "GuardedHttp": "_guarded_http",
         "GuardedResponse": "_guarded_http", "guarded_fetch": "_guarded_http"}

if TYPE_CHECKING:
    from ._guarded_http import GuardedHttp, GuardedResponse, guarded_fetch
    from ._search import Hit, SearchIndex, success_boost, tokenize


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
