"""One SQLite file holds the application's memory and corpus: open it safely or say why not.

WAL mode lets readers read while one writer writes; `synchronous=FULL` makes a commit durable
before it returns, so a writer killed at any point loses only its open transaction. Every
batch a caller writes goes through `transaction()`, which commits all of it or none. A file
that is not a database, a database of another application, a newer schema, a directory or
a path that cannot be written is one sentence (CtxlabError), never a traceback. A command
that only reads opens with `must_exist` (a typo in --db is a sentence, not a new empty
database); one that writes opens with `write` (the default), which checks that the file and
its folder (WAL's -wal and -shm files live beside it) are writable before SQLite is touched.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.memory.schema import APPLICATION_ID, MIGRATE_1_TO_2, SCHEMA, SCHEMA_VERSION
from ctxlab.outputs import check_file

BUSY_TIMEOUT_MS = 10_000


def default_db_path() -> Path:
    """`ctxlab.db` under the user's data directory (platformdirs), e.g. ~/.local/share/ctxlab."""
    import platformdirs

    return Path(platformdirs.user_data_dir("ctxlab", appauthor=False)) / "ctxlab.db"


def now_iso() -> str:
    """The current UTC time as ISO 8601 text (seconds), the store's date format."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class Store:
    """An open store: `conn` for queries, `transaction()` for writes that must be atomic."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: the whole batch is durable on return, or nothing is."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise _explain(self.path, exc) from None
        try:
            yield self.conn
        except sqlite3.OperationalError as exc:
            self._rollback()
            problem = _file_problem(self.path, exc)
            if problem is None:
                raise
            raise problem from None
        except BaseException:
            self._rollback()
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._rollback()
            raise _explain(self.path, exc) from None

    def _rollback(self) -> None:
        _rollback(self.conn)

    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, conn: sqlite3.Connection, key: str, value: str) -> None:
        conn.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(
    path: str | Path | None = None,
    flag: str = "--db",
    *,
    must_exist: bool = False,
    write: bool = True,
) -> Store:
    """Open (creating if needed) the store at `path`, or the default one under the data dir.

    `must_exist`: a command that only reads (search, docs, ask) refuses a missing file rather
    than creating an empty one. `write`: the file and its folder must be writable.
    """
    db = Path(path).expanduser() if path is not None else default_db_path()
    if db.is_dir():
        raise CtxlabError(f"{flag} {db} is a directory; give the path of a database file.")
    if must_exist and not db.exists():
        raise CtxlabError(
            f"{flag} {db} does not exist; nothing has been stored there yet (check the path)."
        )
    if write:
        _check_writable(db, flag)
        check_file(db, flag)  # a scratch file really created: a read-only mount, even as root
    if path is None or not db.parent.exists():
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CtxlabError(
                f"{flag} {db} cannot be created: its folder {db.parent} is not writable "
                f"({exc.strerror})."
            ) from None
    if db.exists() and not os.access(db, os.R_OK):
        raise CtxlabError(f"{flag} {db} cannot be read (permission denied).")
    try:
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except sqlite3.Error as exc:
        raise _explain(db, exc, flag) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check_or_create(conn, db, flag)
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as exc:
        conn.close()
        raise _explain(db, exc, flag) from None
    except CtxlabError:
        conn.close()
        raise
    return Store(db, conn)


def _rollback(conn: sqlite3.Connection) -> None:
    """ROLLBACK if a transaction is still open: on a full disk (SQLITE_FULL) SQLite has
    rolled it back already, and a second ROLLBACK would raise over the real error ("cannot
    rollback - no transaction is active" where a new store's schema did not fit)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _check_or_create(conn: sqlite3.Connection, db: Path, flag: str) -> None:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        conn.execute("BEGIN IMMEDIATE")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables:  # another process created it while this one waited for the lock
            conn.execute("ROLLBACK")
            return _check_or_create(conn, db, flag)
        try:
            for statement in _statements(SCHEMA):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version(application, version) VALUES (?, ?)",
                (APPLICATION_ID, SCHEMA_VERSION),
            )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        return
    if "schema_version" not in tables:
        raise CtxlabError(
            f"{flag} {db} is an SQLite database of another application (no ctxlab schema); "
            "give a new file name."
        )
    row = conn.execute("SELECT application, version FROM schema_version").fetchone()
    if row is None or row[0] != APPLICATION_ID:
        raise CtxlabError(f"{flag} {db} is an SQLite database of another application.")
    if int(row[1]) > SCHEMA_VERSION:
        raise CtxlabError(
            f"{flag} {db} has schema version {row[1]}, newer than this ctxlab's "
            f"{SCHEMA_VERSION}; upgrade ctxlab."
        )
    if int(row[1]) == 1:
        _migrate(conn, MIGRATE_1_TO_2)


def _migrate(conn: sqlite3.Connection, script: str) -> None:
    """Bring an older store up to this schema in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _statements(script):
            conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _statements(script: str) -> list[str]:
    """Split the schema into statements; triggers hold `;` inside BEGIN ... END."""
    out: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        if line.strip().startswith("--") and not current.strip():
            continue
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                out.append(current.strip())
            current = ""
    if current.strip():
        out.append(current.strip())
    return out


def _check_writable(db: Path, flag: str) -> None:
    """Refuse a read-only database (or folder) before SQLite is asked to write to it."""
    if db.exists() and not os.access(db, os.W_OK):
        raise CtxlabError(f"{flag} {db} is read-only; writing needs a writable database file.")
    folder = db.parent
    if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise CtxlabError(
            f"{flag} {db} cannot be written: its folder {folder} is read-only (SQLite keeps "
            "its journal beside the database)."
        )


def _file_problem(db: Path, exc: sqlite3.OperationalError) -> CtxlabError | None:
    """The sentence for a write that failed because of the file (read-only, locked, full),
    or None when the failure is the query's (a bug, raised as it is)."""
    text = str(exc).lower()
    if any(
        w in text for w in ("readonly", "read-only", "locked", "busy", "disk", "unable to open")
    ):
        return _explain(db, exc)
    return None


def _explain(db: Path, exc: sqlite3.Error, flag: str = "--db") -> CtxlabError:
    """One sentence for what went wrong with the file (not with the query)."""
    text = str(exc).lower()
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return CtxlabError(
            f"{flag} {db} is not a ctxlab database (the file is not SQLite or is damaged)."
        )
    if "readonly" in text or "read-only" in text:
        return CtxlabError(f"{flag} {db} is read-only; give a writable path.")
    if "unable to open" in text:
        return CtxlabError(f"{flag} {db} cannot be opened or created (is its folder writable?).")
    if "locked" in text or "busy" in text:
        return CtxlabError(f"{flag} {db} is locked by another writer; try again when it is done.")
    if "disk" in text and ("full" in text or "i/o" in text):
        return CtxlabError(
            f"{flag} {db} cannot be written: {exc} (nothing of this write was kept; free some "
            "space or choose another file)."
        )
    return CtxlabError(f"{flag} {db} cannot be used: {exc}.")
