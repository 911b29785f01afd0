# mypy: implicit-reexport
# ruff: noqa: F401
# (both: the names imported under TYPE_CHECKING are the ones this package re-exports)
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

# Every name is imported from its module when first used, not with the package: a client
# command (`capd call`, `capd mcp`) that needs one error class does not pay for the model,
# the declarations, the upstream pool or the search stack. The same names are imported
# below for mypy (which re-exports them: see the first line).
_EXPORTS = {
    "_agents": "AgentServer AgentSpec InjectionSpec Selection select_capabilities",
    "_assemble": "model_assembler",
    "_build": "BuildConfig build refresh_upstream",
    "_declarations": ("DeclarationSet describe_validation_error load_declarations "
                      "load_topologies parse_tool render_vars"),
    "_errors": ("CapdError ConfigError DeclarationError InvalidTopology PluginError "
                "RegistryError UnknownCapability UnknownTopology"),
    "_events": "CALL_EVENTS CallEvents CannotAsk current_events",
    "_guarded_http": "GuardedHttp GuardedResponse guarded_fetch",
    "_hooks": "HookSpec after_call before_call",
    "_host": "CallerHost HostCaps HostRequirements",
    "_kinds": "SAFETY_LEVELS LatencyClass Safety",
    "_model": ("Capability CommandEffect CommandProbe EffectSpec FileContainsEffect "
               "FileExistsEffect HttpEffect HttpProbe McpProbe OpEffect PartialReplay PathProbe "
               "ProbeResult PythonProbe RetryPolicy TcpProbe ToolSpec UnixProbe estimate_tokens "
               "is_valid_name"),
    "_names": "ALIAS_MARK is_valid_alias is_valid_reference without_mark",
    "_netguard": ("HttpLimitExceeded HttpTimeout HttpUnreachable NetGuard NetGuardError "
                  "SsrfRefused classify_address"),
    "_ops": "CapabilitySpec OpSpec OpTable capability load_plugins op",
    "_outcomes": ("USER_CODE_FAILURES Blocked Partial PermanentToolError ToolAnswer ToolError "
                  "ToolUnavailable TransientToolError"),
    "_probes": "Probe probe_all run_probe",
    "_registry": "DisabledEntry Registry RegistrySnapshot",
    "_routes": "ErrorRoute",
    "_schema": "parameters_schema undescribed_parameters",
    "_search": "Hit SearchIndex success_boost tokenize",
    "_template": "TemplateError placeholders render",
    "_threads": "OpThreads Running ThreadHandle",
    "_topology": ("Topology TopologyExpansion TopologyGroup TopologyPhase TopologyRole "
                  "TopologySet expand_topology parse_count_overrides validate_topology"),
    "_upstream": "UnknownOffer contents_as_json",
    "_upstream_session": "Upstream UpstreamError UpstreamPool",
    "_urls": "UrlHost read_url",
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names.split()}

# Packed like _EXPORTS, module by module, not one name a line:
# isort: off
if TYPE_CHECKING:
    from ._agents import AgentServer, AgentSpec, InjectionSpec, Selection, select_capabilities
    from ._assemble import model_assembler
    from ._build import BuildConfig, build, refresh_upstream
    from ._declarations import (
        DeclarationSet, describe_validation_error, load_declarations, load_topologies,
        parse_tool, render_vars,
    )
    from ._errors import (
        CapdError, ConfigError, DeclarationError, InvalidTopology, PluginError,
        RegistryError, UnknownCapability, UnknownTopology,
    )
    from ._events import CALL_EVENTS, CallEvents, CannotAsk, current_events
    from ._guarded_http import GuardedHttp, GuardedResponse, guarded_fetch
    from ._hooks import HookSpec, after_call, before_call
    from ._kinds import SAFETY_LEVELS, LatencyClass, Safety
    from ._host import CallerHost, HostCaps, HostRequirements
    from ._model import (
        Capability, CommandEffect, CommandProbe, EffectSpec, FileContainsEffect,
        FileExistsEffect, HttpEffect, HttpProbe, McpProbe, OpEffect, PartialReplay,
        PathProbe, ProbeResult, PythonProbe, RetryPolicy, TcpProbe, ToolSpec, UnixProbe,
        estimate_tokens, is_valid_name,
    )
    from ._names import ALIAS_MARK, is_valid_alias, is_valid_reference, without_mark
    from ._netguard import (
        HttpLimitExceeded, HttpTimeout, HttpUnreachable, NetGuard, NetGuardError,
        SsrfRefused, classify_address,
    )
    from ._ops import CapabilitySpec, OpSpec, OpTable, capability, load_plugins, op
    from ._outcomes import (
        USER_CODE_FAILURES, Blocked, Partial, PermanentToolError, ToolAnswer, ToolError,
        ToolUnavailable, TransientToolError,
    )
    from ._probes import Probe, probe_all, run_probe
    from ._registry import DisabledEntry, Registry, RegistrySnapshot
    from ._routes import ErrorRoute
    from ._schema import parameters_schema, undescribed_parameters
    from ._search import Hit, SearchIndex, success_boost, tokenize
    from ._template import TemplateError, placeholders, render
    from ._threads import OpThreads, Running, ThreadHandle
    from ._topology import (
        Topology, TopologyExpansion, TopologyGroup, TopologyPhase, TopologyRole,
        TopologySet, expand_topology, parse_count_overrides, validate_topology,
    )
    from ._upstream import UnknownOffer, contents_as_json
    from ._upstream_session import Upstream, UpstreamError, UpstreamPool
    from ._urls import UrlHost, read_url
else:
    __all__ = sorted(_MODULE_OF)
# isort: on


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})
