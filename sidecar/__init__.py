"""capd's process: ``server/`` is the daemon, ``client/`` the CLI and the MCP bridge.

Importing this package (or the client) never imports the server: what both sides
share is here — the operator table, the errors, default paths.

::

    CapdError
    └── SidecarError
        ├── InvalidParams, BadRequest, Forbidden, Draining   answered by the API
        ├── UnknownAgent, UnresolvedAgent                  answered by the API
        ├── SocketInUse, UnsafeSocketFolder, StateDirLocked   the daemon refuses to start
        └── DaemonUnreachable                           the client finds nothing listening
            └── DaemonDown                              the MCP bridge lost the daemon
"""

from ._errors import (
    BadRequest,
    DaemonDown,
    DaemonUnreachable,
    Draining,
    Forbidden,
    InvalidParams,
    SidecarError,
    SocketInUse,
    StateDirLocked,
    UnknownAgent,
    UnresolvedAgent,
    UnsafeSocketFolder,
)
from ._paths import capd_version, default_socket_path
from ._table import COMMANDS, McpTool, OperatorCommand

__all__ = [
    "COMMANDS",
    "BadRequest",
    "DaemonDown",
    "DaemonUnreachable",
    "Draining",
    "Forbidden",
    "InvalidParams",
    "McpTool",
    "OperatorCommand",
    "SidecarError",
    "SocketInUse",
    "StateDirLocked",
    "UnknownAgent",
    "UnresolvedAgent",
    "UnsafeSocketFolder",
    "capd_version",
    "default_socket_path",
]
