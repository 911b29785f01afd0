"""capd's recovery layer: re-probes with cooldown, the durable retry queue, effect verification.

Its errors (``_errors``)::

    CapdError                    (capd.registry)
    └── RecoveryError
        ├── UnknownTool              a recheck named a tool no capability declares (LookupError)
        └── QueueError               the durable retry queue
            ├── QueueStorageError    the file cannot be used: permissions, pragmas, I/O
            │   ├── QueueCorrupt     not a healthy capd queue (empty, foreign, damaged);
            │   │                    permanent until an operator moves it aside
            │   └── QueueFull        the disk is full; transient, writes resume with space
            ├── QueueClosed          closed on purpose; nothing more is accepted
            ├── IdempotencyConflict  the key is used by a job with other parameters
            ├── UnknownJob           no job has that id (LookupError)
            └── InvalidTransition    the operator action does not apply to the job's state

SQLite and OS errors become :class:`QueueStorageError` (or :class:`QueueFull`,
:class:`QueueCorrupt`) where the queue meets them, with the original as
``__cause__``. What an op raises is not an error here: it is classified into a
``CallOutcome`` (``_calls``).
"""

from . import _tracing as tracing
from ._attempts import RunningAttempts
from ._calls import CallKind, CallOutcome, apply_passive_health, call_capability, classify_error
from ._deadline import deadline
from ._decision import BackoffPolicy
from ._effects import (
    EffectCheck,
    EffectStatus,
    Verdict,
    Verification,
    check_effect,
    combine,
    verify_post_write_effects,
)
from ._errors import (
    IdempotencyConflict,
    InvalidTransition,
    QueueClosed,
    QueueCorrupt,
    QueueError,
    QueueFull,
    QueueStorageError,
    RecoveryError,
    UnknownJob,
    UnknownTool,
)
from ._jobs import JOB_STATES, Attempt, EnqueueRequest, Job, JobState, QueueStats
from ._pg_queue import PgRetryQueue
from ._queue import RetryQueue
from ._queue_file import default_state_dir
from ._recheck import (
    DEFAULT_COOLDOWN_S,
    CapabilityRecheck,
    Rechecker,
    RecheckStats,
    ToolRecheck,
)
from ._store import JobQueue
from ._sweep import RetrySweep

__all__ = [
    "DEFAULT_COOLDOWN_S",
    "JOB_STATES",
    "Attempt",
    "BackoffPolicy",
    "CallKind",
    "CallOutcome",
    "CapabilityRecheck",
    "EffectCheck",
    "EffectStatus",
    "EnqueueRequest",
    "IdempotencyConflict",
    "InvalidTransition",
    "Job",
    "JobQueue",
    "JobState",
    "PgRetryQueue",
    "QueueClosed",
    "QueueCorrupt",
    "QueueError",
    "QueueFull",
    "QueueStats",
    "QueueStorageError",
    "RecheckStats",
    "Rechecker",
    "RecoveryError",
    "RetryQueue",
    "RetrySweep",
    "RunningAttempts",
    "ToolRecheck",
    "UnknownJob",
    "UnknownTool",
    "Verdict",
    "Verification",
    "apply_passive_health",
    "call_capability",
    "check_effect",
    "classify_error",
    "combine",
    "deadline",
    "default_state_dir",
    "tracing",
    "verify_post_write_effects",
]
