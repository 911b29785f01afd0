"""The daemon: config, lifecycle, the HTTP server on the Unix socket, the gateway, metrics.

``Daemon`` is the one place that wires things; request handlers and metrics read it
through the narrow :class:`Services` protocol (``_services.py``).
"""

from ._config import CapdConfig, LoadedConfig, load_config
from ._daemon import Daemon, run_daemon
from ._gateway import Gateway
from ._grant import Caller
from ._result import ToolResult, ToolResultStatus
from ._services import Services

__all__ = [
    "Caller",
    "CapdConfig",
    "Daemon",
    "Gateway",
    "LoadedConfig",
    "Services",
    "ToolResult",
    "ToolResultStatus",
    "load_config",
    "run_daemon",
]
