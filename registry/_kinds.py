"""The words a capability's kind is said in, apart so that a client reads them cheaply."""

from typing import Literal, get_args

LatencyClass = Literal["inner", "outer", "both"]
Safety = Literal["read_only", "writes", "destructive", "external_side_effects"]
SAFETY_LEVELS: tuple[Safety, ...] = get_args(Safety)
