"""capd's recovery layer: re-probes with cooldown (and next, the durable retry queue)."""

from ._errors import RecoveryError, UnknownTool
from ._recheck import (
    DEFAULT_COOLDOWN_S,
    CapabilityRecheck,
    Rechecker,
    RecheckStats,
    ToolRecheck,
)

__all__ = [
    "DEFAULT_COOLDOWN_S",
    "CapabilityRecheck",
    "RecheckStats",
    "Rechecker",
    "RecoveryError",
    "ToolRecheck",
    "UnknownTool",
]
