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

if TYPE_CHECKING:
    from ._agents import (
        AgentServer,
        AgentSpec,
        InjectionSpec,
        Selection,
        select_capabilities,
    )
    from ._assemble import (
        model_assembler,
    )
    from ._build import (
        BuildConfig,
        build,
        refresh_upstream,
    )
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
    from ._events import (
        CALL_EVENTS,
        CallEvents,
        CannotAsk,
        current_events,
    )
    from ._guarded_http import (
        GuardedHttp,
        GuardedResponse,
        guarded_fetch,
    )
    from ._hooks import (
        HookSpec,
        after_call,
        before_call,
    )
    from ._model import (
        SAFETY_LEVELS,
        CallerHost,
        Capability,
        CommandEffect,
        CommandProbe,
        EffectSpec,
        FileContainsEffect,
        FileExistsEffect,
        HostCaps,
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
    from ._names import (
        ALIAS_MARK,
        is_valid_alias,
        is_valid_reference,
        without_mark,
    )
    from ._netguard import (
        HttpLimitExceeded,
        HttpTimeout,
        HttpUnreachable,
        NetGuard,
        NetGuardError,
        SsrfRefused,
        classify_address,
    )
    from ._ops import (
        CapabilitySpec,
        OpSpec,
        OpTable,
        capability,
        load_plugins,
        op,
    )
    from ._outcomes import (
        USER_CODE_FAILURES,
        Blocked,
        Partial,
        PermanentToolError,
        ToolAnswer,
        ToolError,
        ToolUnavailable,
        TransientToolError,
    )
    from ._probes import (
        Probe,
        probe_all,
        run_probe,
    )
    from ._registry import (
        DisabledEntry,
        Registry,
        RegistrySnapshot,
    )
    from ._routes import (
        ErrorRoute,
    )
    from ._schema import (
        parameters_schema,
        undescribed_parameters,
    )
    from ._search import (
        Hit,
        SearchIndex,
        success_boost,
        tokenize,
    )
    from ._template import (
        TemplateError,
        placeholders,
        render,
    )
    from ._threads import (
        OpThreads,
        Running,
        ThreadHandle,
    )
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
    from ._urls import (
        UrlHost,
        read_url,
    )

__all__ = [
    "ALIAS_MARK",
    "CALL_EVENTS",
    "SAFETY_LEVELS",
    "USER_CODE_FAILURES",
    "AgentServer",
    "AgentSpec",
    "Blocked",
    "BuildConfig",
    "CallEvents",
    "CallerHost",
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
    "HostCaps",
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
    "undescribed_parameters",
    "validate_topology",
    "without_mark",
]


# Every name is imported from its module when first used, not with the package: a client
# command (`capd call`, `capd mcp`) that needs one error class does not pay for the model,
# the declarations, the upstream pool or the search stack.
_LAZY: dict[str, str] = {
    'ALIAS_MARK': '_names',
    'AgentServer': '_agents',
    'AgentSpec': '_agents',
    'Blocked': '_outcomes',
    'USER_CODE_FAILURES': '_outcomes',
    'BuildConfig': '_build',
    'CALL_EVENTS': '_events',
    'CallEvents': '_events',
    'CannotAsk': '_events',
    'CallerHost': '_model',
    'Capability': '_model',
    'CapabilitySpec': '_ops',
    'CapdError': '_errors',
    'CommandEffect': '_model',
    'CommandProbe': '_model',
    'ConfigError': '_errors',
    'DeclarationError': '_errors',
    'DeclarationSet': '_declarations',
    'DisabledEntry': '_registry',
    'EffectSpec': '_model',
    'ErrorRoute': '_routes',
    'FileContainsEffect': '_model',
    'FileExistsEffect': '_model',
    'GuardedHttp': '_guarded_http',
    'GuardedResponse': '_guarded_http',
    'Hit': '_search',
    'HookSpec': '_hooks',
    'HostCaps': '_model',
    'HostRequirements': '_model',
    'HttpEffect': '_model',
    'HttpLimitExceeded': '_netguard',
    'HttpProbe': '_model',
    'HttpTimeout': '_netguard',
    'HttpUnreachable': '_netguard',
    'InjectionSpec': '_agents',
    'InvalidTopology': '_errors',
    'LatencyClass': '_kinds',
    'McpProbe': '_model',
    'NetGuard': '_netguard',
    'NetGuardError': '_netguard',
    'OpEffect': '_model',
    'OpSpec': '_ops',
    'OpTable': '_ops',
    'OpThreads': '_threads',
    'Partial': '_outcomes',
    'PartialReplay': '_model',
    'PathProbe': '_model',
    'PermanentToolError': '_outcomes',
    'PluginError': '_errors',
    'Probe': '_probes',
    'ProbeResult': '_model',
    'PythonProbe': '_model',
    'Registry': '_registry',
    'RegistryError': '_errors',
    'RegistrySnapshot': '_registry',
    'RetryPolicy': '_model',
    'Running': '_threads',
    'SAFETY_LEVELS': '_kinds',
    'Safety': '_kinds',
    'SearchIndex': '_search',
    'Selection': '_agents',
    'SsrfRefused': '_netguard',
    'TcpProbe': '_model',
    'TemplateError': '_template',
    'ThreadHandle': '_threads',
    'ToolAnswer': '_outcomes',
    'ToolError': '_outcomes',
    'ToolSpec': '_model',
    'ToolUnavailable': '_outcomes',
    'Topology': '_topology',
    'TopologyExpansion': '_topology',
    'TopologyGroup': '_topology',
    'TopologyPhase': '_topology',
    'TopologyRole': '_topology',
    'TopologySet': '_topology',
    'TransientToolError': '_outcomes',
    'UnixProbe': '_model',
    'UnknownCapability': '_errors',
    'UnknownOffer': '_upstream',
    'UnknownTopology': '_errors',
    'Upstream': '_upstream',
    'UpstreamError': '_upstream',
    'UpstreamPool': '_upstream',
    'UrlHost': '_urls',
    'after_call': '_hooks',
    'before_call': '_hooks',
    'build': '_build',
    'capability': '_ops',
    'classify_address': '_netguard',
    'contents_as_json': '_upstream',
    'current_events': '_events',
    'describe_validation_error': '_declarations',
    'estimate_tokens': '_model',
    'expand_topology': '_topology',
    'guarded_fetch': '_guarded_http',
    'is_valid_alias': '_names',
    'is_valid_name': '_model',
    'is_valid_reference': '_names',
    'load_declarations': '_declarations',
    'load_plugins': '_ops',
    'load_topologies': '_declarations',
    'model_assembler': '_assemble',
    'op': '_ops',
    'parameters_schema': '_schema',
    'undescribed_parameters': '_schema',
    'parse_count_overrides': '_topology',
    'parse_tool': '_declarations',
    'placeholders': '_template',
    'probe_all': '_probes',
    'read_url': '_urls',
    'refresh_upstream': '_build',
    'render': '_template',
    'render_vars': '_declarations',
    'run_probe': '_probes',
    'select_capabilities': '_agents',
    'success_boost': '_search',
    'tokenize': '_search',
    'validate_topology': '_topology',
    'without_mark': '_names',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
