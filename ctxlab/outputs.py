"""The one way results reach the disk: checked up front, written whole or not at all.

A full disk, a read-only file system or a file where a folder should be would otherwise
surface as a traceback after minutes of work (a probe that already evicted the server's
cache, a workshop half run), and a write cut short leaves a truncated `results.json` that
looks complete. So every command checks where its results go before it starts
(`check_folder`, `check_file`: the folder is created and a scratch file is really created
and removed in it, which is the only test that sees a read-only mount or a full quota, and
works for root too), and writes through `atomic_write` / `write_text` / `save_figure`: a
temporary name in the same folder, flushed and renamed over the target only when complete.
Failures are one sentence naming the path and what the errno means. Nothing here imports
torch or matplotlib.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Protocol

from ctxlab.errors import CtxlabError
from ctxlab.inputs import shown

# What a full or read-only file system raises: the CLI turns any of these into one sentence
# even where a write was not wrapped (a last net; every command's own writes are wrapped).
FULL_OR_READ_ONLY = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


class Figure(Protocol):
    """What `save_figure` needs of a matplotlib figure."""

    def savefig(self, fname: str, **kwargs: object) -> None: ...


def write_error(path: Path | str, exc: OSError, flag: str = "") -> CtxlabError:
    """One sentence for a failed write: the path, the errno's meaning and its name."""
    code = exc.errno or 0
    meaning = exc.strerror or os.strerror(code)
    name = errno.errorcode.get(code, "")
    hint = {
        errno.ENOSPC: "; free some space or choose another folder",
        errno.EROFS: "; choose a folder on a writable file system",
        errno.EACCES: "; choose a folder you can write to",
        errno.ENOTDIR: "; a part of the path is a file, not a folder",
    }.get(code, "")
    label = f"{flag} {shown(path)}" if flag else shown(path)
    return CtxlabError(f"{label} cannot be written: {meaning}{f' ({name})' if name else ''}{hint}.")


def _first_file_above(folder: Path) -> Path | None:
    for part in (folder, *folder.parents):
        if part.exists() or part.is_symlink():
            return None if part.is_dir() else part
    return None


def check_folder(path: Path, flag: str = "--out") -> Path:
    """Create (or reuse) an output folder and prove a file can be created in it, before any
    work; a file in its place, a read-only or full file system is one sentence."""
    path = Path(path)
    blocker = _first_file_above(path)
    if blocker == path:
        raise CtxlabError(
            f"{flag} {shown(path)} is a file; give a folder (it is created if missing)."
        )
    if blocker is not None:
        raise CtxlabError(f"{flag} {shown(path)}: {shown(blocker)} is a file, not a folder.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(path, exc, flag) from None
    _probe(path, path, flag)
    return path


def check_file(path: Path, flag: str = "--out") -> Path:
    """A file that will be written after the work: its folder exists (created if missing)
    and takes a new file, and the path itself is not a folder."""
    path = Path(path)
    if path.is_dir():
        raise CtxlabError(f"{flag} {shown(path)} is a folder; give a file name.")
    _check_parent(path, flag)
    return path


def _check_parent(path: Path, flag: str) -> None:
    parent = path.parent
    blocker = _first_file_above(parent)
    if blocker is not None:
        raise CtxlabError(f"{flag} {shown(path)}: {shown(blocker)} is a file, not a folder.")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(parent, exc, flag) from None
    _probe(parent, path, flag)


def _probe(folder: Path, named: Path, flag: str) -> None:
    """Create and remove a scratch file in `folder` (what a write will need)."""
    try:
        fd, scratch = tempfile.mkstemp(dir=folder, prefix=".ctxlab-probe-")
    except OSError as exc:
        raise write_error(named, exc, flag) from None
    os.close(fd)
    os.unlink(scratch)


@contextmanager
def atomic_write(path: Path, flag: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `path` (same suffix, so writers that read the suffix
    still work); on success it is synced and renamed over `path`, on any failure removed.
    An OSError becomes one sentence naming `path`."""
    path = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{path.name}.", suffix=f".part{path.suffix}"
        )
        os.close(fd)
    except OSError as exc:
        raise write_error(path, exc, flag) from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _mode_for(path))
        _sync(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc, flag) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The permissions `path` gets: those of the file it replaces, else what a plain
    `open(path, "w")` would give (0666 less the umask). A temporary file is created 0600,
    which, renamed, would hide a report from every other user of the machine."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """This process's umask, read without changing it where Linux shows it (setting it to
    read it back would race with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fill(path: Path, data: bytes) -> None:
    """Write `data` to `path` (one place, so a test can make the disk full here)."""
    with open(path, "wb") as handle:
        handle.write(data)


def write_bytes(path: Path, data: bytes, flag: str = "") -> Path:
    """Write `data` to `path` whole or not at all."""
    with atomic_write(path, flag) as tmp:
        _fill(tmp, data)
    return Path(path)


def write_text(path: Path, text: str, flag: str = "") -> Path:
    """Write UTF-8 `text` to `path` whole or not at all."""
    return write_bytes(path, text.encode("utf-8"), flag)


def save_figure(fig: Figure, path: Path, flag: str = "", **kwargs: object) -> Path:
    """`fig.savefig(path, **kwargs)` whole or not at all (the format from `path`'s suffix)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    with atomic_write(path, flag) as tmp:
        fig.savefig(str(tmp), format=fmt, **kwargs)
    return Path(path)


def check_inside(name: str, what: str) -> str:
    """`name` if it is a relative path that stays inside the folder it is joined to (no
    absolute path, no `..`): a config that says its files go under the run's output folder
    must not write outside it. One sentence naming the field otherwise."""
    parts = PurePath(name).parts
    if PurePath(name).is_absolute() or ".." in parts or name.startswith("~"):
        raise CtxlabError(
            f"{what} {shown(name)!r} leaves the run's output folder; give a folder inside it "
            "(a relative path without '..', e.g. \"offload\")."
        )
    return name
