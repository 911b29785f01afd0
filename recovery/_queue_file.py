"""The queue's SQLite file: schema, pragmas, creating it, and refusing one that is not ours.

The file is only ever initialised by capd itself: a new queue is created and
migrated under a temporary name beside it and hard-linked into place, which
never replaces a file. Anything already at the path (an empty file, another
database, garbage) is refused with :class:`QueueCorrupt` and left as it is.
An existing queue is inspected read-only before anything writes to it, then
put in WAL mode with ``synchronous=FULL`` (checked, not assumed) and migrated
to :data:`SCHEMA_VERSION`.

Failures of SQLite and the OS are translated here, for this module and for
the group commit: a full disk is :class:`QueueFull`, a file that is not a
database :class:`QueueCorrupt`, anything else :class:`QueueStorageError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
import stat
import struct
from pathlib import Path
from typing import Literal

import aiosqlite
import structlog

from ._errors import QueueCorrupt, QueueFull, QueueStorageError

log = structlog.get_logger("capd.queue")

SCHEMA_VERSION = 3
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        capability TEXT NOT NULL,
        params TEXT NOT NULL,
        idempotency_key TEXT,
        policy TEXT NOT NULL CHECK (policy IN ('manual', 'replay', 'verify_first')),
        state TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'partial',
                                             'needs_operator', 'dead', 'cancelled')),
        attempts INTEGER NOT NULL DEFAULT 0,
        max_attempts INTEGER NOT NULL,
        next_run_at REAL NOT NULL,
        lease_until REAL,
        fence INTEGER NOT NULL DEFAULT 0,
        boot_id TEXT,
        first_sent_at REAL NOT NULL,
        timeout_s REAL NOT NULL,
        last_error TEXT,
        error_class TEXT,
        first_error TEXT,
        first_error_class TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX jobs_due ON jobs (state, next_run_at);
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        fence INTEGER,
        boot_id TEXT,
        outcome TEXT,
        detail TEXT
    );
    CREATE INDEX attempts_job ON attempts (job_id, id);
    """,
    # An operator's retry: when it was asked (the job's age counts from it), so that
    # created_at stays when the job was accepted.
    2: """
    ALTER TABLE jobs ADD COLUMN retried_at REAL;
    """,
    # Finished jobs by when they finished: the retention pass reads only what expired.
    3: """
    CREATE INDEX jobs_finished ON jobs (state, updated_at);
    """,
}


async def open_queue_file(path: Path, *, synchronous: Literal["FULL", "NORMAL"] = "FULL",
                          busy_timeout_ms: int = 5000) -> aiosqlite.Connection:
    """Open (creating or migrating) the queue file at ``path``; return its connection.

    When nothing is at ``path``, a new queue is built beside it and linked
    into place (see :func:`_create_queue_file`). Raises :class:`QueueCorrupt`
    for a file that is not a healthy capd queue (an empty file included),
    :class:`QueueFull` when the disk is full, and :class:`QueueStorageError`
    when it cannot be opened or a pragma did not take. None of them ever
    replaces the file. The connection is in autocommit mode (transactions are
    explicit) and yields :class:`sqlite3.Row` rows; the caller closes it.
    """
    try:
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(path, "cannot create the folder of", exc) from exc
    if not await asyncio.to_thread(_queue_file_exists, path):
        await _create_queue_file(path, busy_timeout_ms)
        # Ours, or one another process linked first: the same checks either way.
        if not await asyncio.to_thread(_queue_file_exists, path):
            raise QueueStorageError(f"the queue {path} vanished as soon as it was created; "
                                    "is something else cleaning the state directory?")
    # Before any connection: SQLite would take a damaged WAL for an empty one, and drop the
    # acknowledged jobs it holds at the first write.
    await asyncio.to_thread(check_wal, path)
    db = await _connect(path, path, "rw", "cannot open")
    db.row_factory = sqlite3.Row
    try:
        await _inspect(db, path)  # reads only: a foreign file is refused untouched
        await _configure(db, path, synchronous, busy_timeout_ms)
        await _migrate(db, path)
    except BaseException:
        await db.close()
        raise
    return db


_WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums little-endian, big-endian
_WAL_VERSION = 3007000


def check_wal(path: Path) -> None:
    """Refuse a ``-wal`` file beside ``path`` that is not a valid WAL of that database.

    SQLite treats a WAL whose header is damaged (its magic, version, page size or
    header checksum wrong) as empty, and reads one only up to its first damaged frame:
    the transactions after it, acknowledged jobs among them, would be gone without a
    word at the next write. So a damaged header is refused, and so is a damaged frame
    with frames of the same log after it (a frame torn at the very end, by a crash in
    the middle of a write that was never acknowledged, is not damage). An empty WAL file
    is valid. Raises :class:`QueueCorrupt` with the same advice as a damaged
    ``queue.db``; :class:`QueueStorageError` when the files cannot be read.
    """
    wal = path.with_name(path.name + "-wal")
    try:
        with open(wal, "rb") as handle:
            header = handle.read(32)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise storage_error(wal, "cannot read", exc) from exc
    if not header:
        return
    try:
        with open(path, "rb") as handle:
            db_header = handle.read(100)
    except OSError as exc:
        raise storage_error(path, "cannot read", exc) from exc
    problem = _wal_problem(wal, header, db_header)
    if problem is not None:
        raise QueueCorrupt(
            f"the queue's write-ahead log {wal} is damaged ({problem}): it may hold "
            "acknowledged jobs that SQLite would drop without a word; move it and "
            f"{path.name} aside together and inspect them with sqlite3 — capd never "
            "replaces them")


WAL_FRAMES_CHECKED_UP_TO = 256 << 20
"""A longer WAL has its header checked only (its frames would take seconds to sum)."""


def _wal_problem(wal: Path, header: bytes, db_header: bytes) -> str | None:
    """What is wrong with the WAL ``wal`` whose first 32 bytes are ``header``, for the
    database whose first bytes are ``db_header``; None when it is sound.

    Its frames are summed too: a break with more of the same log after it is damage; a
    torn last frame (never committed, so never acknowledged) is not.
    """
    if len(header) < 32:
        return f"{len(header)} bytes, shorter than a WAL header"
    magic, version, page_size, _seq, salt1, salt2, sum1, sum2 = struct.unpack(">8I", header)
    if magic not in _WAL_MAGIC:
        return f"magic {magic:#010x} is not a WAL's"
    if version != _WAL_VERSION:
        return f"format version {version}, not {_WAL_VERSION}"
    if len(db_header) >= 18:
        raw = struct.unpack(">H", db_header[16:18])[0]
        db_page = 65536 if raw == 1 else raw
        if page_size != db_page:
            return f"page size {page_size}, the database's is {db_page}"
    order = ">" if magic & 1 else "<"
    if _wal_checksum(struct.unpack(f"{order}6I", header[:24]), 0, 0) != (sum1, sum2):
        return "its header checksum does not match"
    try:
        if wal.stat().st_size > WAL_FRAMES_CHECKED_UP_TO:
            log.warning("queue_wal_not_summed", path=str(wal), bytes=wal.stat().st_size)
            return None
        data = wal.read_bytes()
    except OSError as exc:
        raise storage_error(wal, "cannot read", exc) from exc
    frame = 24 + page_size
    words = struct.Struct(f"{order}{(8 + page_size) // 4}I")
    s0, s1 = sum1, sum2
    for index, offset in enumerate(range(32, len(data) - frame + 1, frame)):
        _page, _commit, f1, f2, c1, c2 = struct.unpack_from(">6I", data, offset)
        if (f1, f2) != (salt1, salt2):
            return None  # the end of this log: what follows is an older one's
        s0, s1 = _wal_checksum(
            words.unpack(data[offset:offset + 8] + data[offset + 24:offset + frame]), s0, s1)
        if (s0, s1) != (c1, c2):
            if any(struct.unpack_from(">2I", data, later + 8) == (salt1, salt2)
                   for later in range(offset + frame, len(data) - frame + 1, frame)):
                return (f"frame {index + 1} does not match its checksum and more of the "
                        "log follows it")
            return None  # a torn last frame
    return None


def _wal_checksum(words: tuple[int, ...], s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum of ``words`` (an even count), continuing from ``(s0, s1)``."""
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def free_space(path: Path) -> tuple[int, int]:
    """Bytes free to an unprivileged writer on the file system holding ``path``, and its
    size."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


RESERVE_MIN_BYTES = 16 * 2**20


def default_reserve(total_bytes: int) -> int:
    """The room kept for the queue's own progress: the larger of 16 MiB and 5 % of the
    file system."""
    return max(RESERVE_MIN_BYTES, total_bytes // 20)


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` (from SQLite or the OS) says the filesystem is full."""
    if isinstance(exc, sqlite3.Error):
        return _primary_code(exc) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def storage_error(path: Path, failed: str, exc: BaseException) -> QueueStorageError:
    """Translate ``exc`` from SQLite or the OS; ``failed`` reads "could not commit to" and the like.

    The caller raises the result ``from exc``.
    """
    if is_disk_full(exc):
        return QueueFull(f"disk full: {failed} the queue {path} ({exc}); free space on its "
                         "filesystem — capd retries by itself, nothing needs restarting")
    return QueueStorageError(f"{failed} the queue {path}: {exc}")


def _open_error(path: Path, exc: sqlite3.Error) -> QueueStorageError:
    """Tell a file that is not a database (or a damaged one) from one that cannot be used now."""
    if _primary_code(exc) in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        return QueueCorrupt(f"{path} is not a readable capd queue ({exc}); {_INSPECT_IT}")
    return storage_error(path, "cannot open", exc)


def _uri(file: Path, mode: str) -> str:
    return f"{file.absolute().as_uri()}?mode={mode}"


_INSPECT_IT = "move it aside and inspect it — capd never replaces it"
_START_AGAIN = ("move it aside (capd never replaces it) and start capd again to create a new "
                "queue")


def _primary_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``exc`` (``SQLITE_FULL``...), when it carries one."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


async def _connect(path: Path, file: Path, mode: Literal["rw", "rwc"],
                   failed: str) -> aiosqlite.Connection:
    """An autocommit connection to ``file`` (``path`` or its temporary twin); errors name
    ``path``. mode=rw never creates a file: only :func:`_create_queue_file` may."""
    try:
        return await aiosqlite.connect(_uri(file, mode), uri=True, isolation_level=None)
    except (sqlite3.Error, OSError) as exc:
        raise storage_error(path, failed, exc) from exc


def _queue_file_exists(path: Path) -> bool:
    """False when nothing is at ``path``; raise :class:`QueueCorrupt` for what cannot be a queue."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(path, "cannot look at", exc) from exc
    if not stat.S_ISREG(info.st_mode):
        raise QueueCorrupt(f"{path} is not a regular file: not a capd queue; {_START_AGAIN}")
    if info.st_size == 0:
        wal = path.with_name(path.name + "-wal")
        hint = ""
        with contextlib.suppress(OSError):
            if wal.stat().st_size > 0:
                hint = f"; {wal} beside it is not empty and may hold jobs: keep the two together"
        raise QueueCorrupt(
            f"{path} is empty: not a capd queue; move it aside (capd never replaces it), restore "
            f"it from a backup if it held jobs, or start capd again to create a new queue{hint}")
    return True


def _discard_temporary(tmp: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{tmp}{suffix}")


def _install(tmp: Path, path: Path) -> bool:
    """Hard-link the finished ``tmp`` to ``path`` unless something is there; False if it was.

    ``tmp`` is gone afterwards either way. The folder is fsynced so the new
    name survives a power cut.
    """
    with contextlib.suppress(FileNotFoundError):
        if os.stat(f"{tmp}-wal").st_size > 0:  # only the main file is linked: it must be whole
            raise QueueStorageError(f"cannot create the queue {path}: the new file's WAL was "
                                    "not folded into it when it was closed")
    try:
        # The jobs hold callers' parameters: the file (and the WAL and shared-memory files
        # SQLite makes with its mode) is the daemon user's alone.
        os.chmod(tmp, 0o600)
        _fsync(tmp, os.O_RDONLY)
        try:
            os.link(tmp, path)  # unlike rename, link never replaces what is at path
        except FileExistsError:
            return False
        finally:
            _discard_temporary(tmp)
        _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise storage_error(path, "could not put in place", exc) from exc
    return True


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _create_queue_file(path: Path, busy_timeout_ms: int) -> None:
    """Build a migrated queue under a temporary name beside ``path``, then link it there.

    Nothing at ``path`` is ever replaced: when another process linked a
    queue first, ours is dropped and the caller opens theirs. Closing the
    temporary database before the link checkpoints its WAL into the main
    file, so the one file linked holds the whole schema. On any failure
    the temporary files are removed.
    """
    tmp = path.with_name(f"{path.name}.init-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        db = await _connect(path, tmp, "rwc", "cannot create")
        try:
            # Messages name the path the operator knows, not the temporary one.
            await _configure(db, path, "FULL", busy_timeout_ms)
            await _migrate(db, path)
            try:
                row = await (await db.execute("PRAGMA wal_checkpoint(TRUNCATE)")).fetchone()
            except sqlite3.Error as exc:
                raise storage_error(path, "cannot create", exc) from exc
            if row is None or row[0] != 0:
                raise QueueStorageError(f"cannot create the queue {path}: the new file's "
                                        "WAL could not be checkpointed")
        finally:
            await db.close()
        installed = await asyncio.to_thread(_install, tmp, path)
    except BaseException:
        # A few unlinks, done here and now: a second cancellation must not skip them.
        _discard_temporary(tmp)
        raise
    if installed:
        log.info("queue_created", path=str(path), version=SCHEMA_VERSION)
    else:
        log.info("queue_created_elsewhere", path=str(path))


async def _inspect(db: aiosqlite.Connection, path: Path) -> None:
    """Refuse an existing file that is not a healthy capd queue, without writing to it.

    Only a file being created by :func:`_create_queue_file` may start from
    schema version 0; an existing one at version 0, or one that claims a
    version but lacks the tables, is not a capd queue. A version newer than
    this capd knows is left for that capd (:class:`QueueStorageError`).
    """
    try:
        check = await (await db.execute("PRAGMA quick_check")).fetchone()
        row = await (await db.execute("PRAGMA user_version")).fetchone()
        tables = await (await db.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
            " AND name IN ('jobs', 'attempts')")).fetchone()
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    if check is None or check[0] != "ok":
        raise QueueCorrupt(
            f"the queue {path} failed its integrity check ({check[0] if check else '?'});"
            " move it aside and inspect it with sqlite3 — capd never replaces it")
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise QueueStorageError(
            f"the queue {path} has schema version {version}, newer than this capd "
            f"understands ({SCHEMA_VERSION}); upgrade capd")
    if version == 0:
        raise QueueCorrupt(f"{path} is a SQLite database but not a capd queue (it has no capd "
                           f"schema); {_START_AGAIN}")
    if tables is None or tables[0] != 2:
        raise QueueCorrupt(f"{path} says it is capd queue schema version {version} but lacks "
                           f"its tables; {_INSPECT_IT}")


async def _migrate(db: aiosqlite.Connection, path: Path) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION`.

    Runs after :func:`_inspect` (an existing file) or on a file being
    created, the only one that may start from version 0.
    """
    try:
        row = await (await db.execute("PRAGMA user_version")).fetchone()
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    version = int(row[0]) if row else 0
    for target in range(version + 1, SCHEMA_VERSION + 1):
        try:
            await db.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[target].split(";"):
                    if statement.strip():
                        await db.execute(statement)
                await db.execute(f"PRAGMA user_version = {target}")
                await db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                    with contextlib.suppress(sqlite3.Error):
                        await db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise storage_error(path, "could not migrate", exc) from exc
        log.info("queue_migrated", path=str(path), version=target)


async def _configure(db: aiosqlite.Connection, path: Path, synchronous: str,
                     busy_timeout_ms: int) -> None:
    """Set WAL, ``synchronous``, the busy timeout and foreign keys, and check that they took."""
    wanted = {"journal_mode": "wal", "synchronous": {"FULL": 2, "NORMAL": 1}[synchronous],
              "busy_timeout": busy_timeout_ms, "foreign_keys": 1}
    try:
        await db.execute("PRAGMA journal_mode = WAL")
        await db.execute(f"PRAGMA synchronous = {synchronous}")
        await db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        await db.execute("PRAGMA foreign_keys = ON")
        actual = {}
        for name in wanted:
            row = await (await db.execute(f"PRAGMA {name}")).fetchone()
            actual[name] = row[0] if row else None
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from exc
    if str(actual["journal_mode"]).lower() != "wal":
        raise QueueStorageError(
            f"the queue {path} could not switch to WAL (journal_mode is "
            f"{actual['journal_mode']}); put the state directory on a local filesystem")
    for name in ("synchronous", "busy_timeout", "foreign_keys"):
        if actual[name] != wanted[name]:
            raise QueueStorageError(
                f"the queue {path}: PRAGMA {name} is {actual[name]}, expected {wanted[name]}")


def default_state_dir() -> Path:
    """``$CAPD_STATE_DIR``, else ``/var/lib/capd`` as root, else ``$XDG_STATE_HOME/capd``."""
    explicit = os.environ.get("CAPD_STATE_DIR")
    if explicit:
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/var/lib/capd")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "capd"
