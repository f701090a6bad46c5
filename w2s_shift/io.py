"""Atomic result files: every artifact is written to a temporary file in the same folder and renamed,
so a killed run never leaves a half-written file that a rerun would read as complete."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

#: A label that becomes a file name (method and dataset labels): no '/', no leading '.', at most 64 characters.
SAFE_NAME = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename). Creates parent folders.

    Raises:
        OSError: the file cannot be written; one from the write itself (disk full, quota, ``ulimit -f``) names
            ``path`` as its filename and says the free space left (:func:`write_error`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise write_error(e, path) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results get the mode a plain open() would give
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(e, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_error(e: OSError, path: Path) -> OSError:
    """``e`` as an OSError naming the result file ``path`` (a failed write names no file, or the temporary one),
    with the free space left on its disk when space ran out (ENOSPC, EDQUOT) or the file size limit (EFBIG)."""
    import errno
    import shutil

    why = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        try:
            disk = next((d for d in Path(path).parents if d.exists()), Path("."))  # its folder may not exist yet
            why += f" ({shutil.disk_usage(disk).free / 2**20:.0f} MiB free on its disk"
            why += "; or the file size limit, ulimit -f, was reached)" if e.errno == errno.EFBIG else ")"
        except OSError:
            pass
    return OSError(e.errno, f"cannot write this result file: {why}", str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def write_jsonl_atomic(path: str | os.PathLike, rows) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows))


def read_json(path: str | os.PathLike):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_jsonl(path: str | os.PathLike) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


#: sha256 of the files already hashed, keyed by (resolved path, size, mtime_ns, ctime_ns, inode): a file is read once
#: while all four stay the same (:func:`remember_sha256` carries the keys over to another process). Size and
#: modification time alone are not enough: ``cp -p``, ``rsync -a`` and ``touch -r`` set them back after an edit;
#: the change time and the inode, as git's index also compares, no user-level tool sets back.
SHA256_CACHE: dict = {}

#: The stat fields of a cache key after the path, as :func:`sha256_records` names them.
_STAT_FIELDS = ("size", "mtime_ns", "ctime_ns", "ino")


def _stat_key(path) -> tuple:
    p = Path(path).resolve()
    st = p.stat()
    return (str(p), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's bytes, read once while its size, modification and change times and inode are
    unchanged.

    Raises:
        OSError: the file cannot be read."""
    return files_sha256([path])


def files_sha256(paths: list) -> str | None:
    """sha256 (hex) of the files' bytes read one after the other (one file: its own sha256); None for no file.
    Cached while every file keeps its size, modification and change times and inode.

    Raises:
        OSError: a file cannot be read."""
    if not paths:
        return None
    keys = [_stat_key(p) for p in paths]
    key = keys[0] if len(keys) == 1 else tuple(keys)
    if key not in SHA256_CACHE:
        h = hashlib.sha256()
        for k in keys:
            with open(k[0], "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        SHA256_CACHE[key] = h.hexdigest()
    return SHA256_CACHE[key]


def sha256_records(paths: list) -> dict:
    """``{resolved path: {"size", "mtime_ns", "ctime_ns", "ino", "sha256"}}`` of the readable files among ``paths``
    (hashed now if needed), for :func:`remember_sha256` in a later process."""
    out = {}
    for f in paths:
        try:
            key = _stat_key(f)
            sha = file_sha256(f)
        except OSError:
            continue
        out[key[0]] = {**dict(zip(_STAT_FIELDS, key[1:])), "sha256": sha}
    return out


def remember_sha256(records: dict) -> None:
    """Add :func:`sha256_records` output to the cache; an entry is used only while its file keeps that size,
    modification and change times and inode. Records without all four (older ``inputs.json`` files) are left out:
    their files are hashed again."""
    for path, r in records.items():
        try:
            key = (str(path), *(int(r[k]) for k in _STAT_FIELDS))
            SHA256_CACHE.setdefault(key, str(r["sha256"]))
        except (KeyError, TypeError, ValueError):
            continue


def file_slug(name: str) -> str:
    """``name`` as a file-name part: every run of characters other than letters, digits, '.', '_' and '-' becomes
    one '_' (a dataset's display name in ``plots/<source>-<kind>.png`` or ``bon/<source>/``)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
