"""capd's process: config, the daemon and its Unix-socket API, the gateway, the CLI.

::

    CapdError
    └── SidecarError
        ├── InvalidParams, BadRequest, Draining
        └── SocketInUse, UnsafeSocketFolder, StateDirLocked, DaemonUnreachable
"""

from ._config import CapdConfig, LoadedConfig, load_config
from ._daemon import Daemon
from ._errors import (
    BadRequest,
    DaemonUnreachable,
    Draining,
    InvalidParams,
    SidecarError,
    SocketInUse,
    StateDirLocked,
    UnsafeSocketFolder,
)
from ._gateway import Caller, Gateway, ToolResult, ToolResultStatus
from ._table import COMMANDS, McpTool, OperatorCommand, Option

__all__ = [
    "COMMANDS",
    "BadRequest",
    "Caller",
    "CapdConfig",
    "Daemon",
    "DaemonUnreachable",
    "Draining",
    "Gateway",
    "InvalidParams",
    "LoadedConfig",
    "McpTool",
    "OperatorCommand",
    "Option",
    "SidecarError",
    "SocketInUse",
    "StateDirLocked",
    "ToolResult",
    "ToolResultStatus",
    "UnsafeSocketFolder",
    "load_config",
]
