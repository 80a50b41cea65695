"""The one check for a path a user hands in to be read: a regular file, or one sentence.

Opening a FIFO with no writer blocks forever, a symlink loop or a directory named like a
file fails deep in whatever reads it, and a name that is not UTF-8 (Python hands it over
with lone surrogates) cannot even be printed. Every command that reads a file checks it
here first, and reads it here too: `read_file_bytes` opens with O_NONBLOCK and checks the
opened file again, so a path swapped for a FIFO between the check and the read still cannot
hang. Names in messages go through `shown`, which writes undecodable bytes and control
characters as escapes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ctxlab.errors import CtxlabError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def shown(path: str | os.PathLike[str] | os.PathLike[bytes] | bytes) -> str:
    """A path as printable text: bytes that are not UTF-8 as `\\xff`, control characters as
    `\\n`, `\\x1b`, so a message can always be printed and names the file unambiguously."""
    raw = os.fsencode(path)
    text = raw.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def kind_of(mode: int) -> str:
    """What a stat mode is, in words ('a regular file', 'a named pipe (FIFO)', ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def check_input_file(
    path: str | os.PathLike[str], what: str = "file", expect: str = "a regular file"
) -> Path:
    """`path` if it is a regular file that can be opened for reading (symlinks followed);
    otherwise one sentence naming the path (escaped), what it is instead, and `expect`.
    Never opens the path, so a FIFO is refused without blocking."""
    path = Path(path)
    name = f"{what} {shown(path)}"
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise _stat_error(path, name, exc) from None
    if not stat.S_ISREG(mode):
        if stat.S_ISDIR(mode):
            raise CtxlabError(f"{name} is a directory; give {expect}.")
        raise CtxlabError(f"{name} is {kind_of(mode)}, not a regular file; give {expect}.")
    return path


def _stat_error(path: Path, name: str, exc: OSError) -> CtxlabError:
    if exc.errno == errno.ELOOP:
        return CtxlabError(f"{name} is a symbolic link loop (it points back to itself).")
    if exc.errno == errno.ENOENT:
        if os.path.islink(path):
            target = shown(os.readlink(path))
            return CtxlabError(f"{name} is a symbolic link to {target}, which does not exist.")
        return CtxlabError(f"{name} does not exist.")
    if exc.errno == errno.ENOTDIR:
        return CtxlabError(f"{name} does not exist: a part of its path is a file, not a folder.")
    if exc.errno == errno.ENAMETOOLONG:
        return CtxlabError(f"{name} is a name too long for the file system.")
    reason = exc.strerror or os.strerror(exc.errno or 0)
    return CtxlabError(f"{name} cannot be read ({reason}).")


def read_file_bytes(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """The bytes of a regular file, through `check_input_file`; the open does not block and
    the opened file is checked again (it may have been replaced after the check)."""
    path = check_input_file(path, what)
    name = f"{what} {shown(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _stat_error(path, name, exc) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CtxlabError(f"{name} is {kind_of(mode)}, not a regular file; give a file.")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as exc:
        reason = exc.strerror or os.strerror(exc.errno or 0)
        raise CtxlabError(f"{name} cannot be read ({reason}).") from None
    finally:
        os.close(fd)
