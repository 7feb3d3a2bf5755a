"""A small on-disk cache of decoded arrays (``.npz``), keyed by the source files' identity.

Decoding tens of thousands of JPEG/PNG files takes seconds to minutes; loaders that decode images take
an explicit ``cache_dir`` (never a default directory) and store the decoded, *unshuffled* arrays there,
so one cache file serves every seed. The key hashes the sources' names, sizes and modification times,
so a changed source invalidates the entry. Writes are atomic (temporary file, then rename).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

CACHE_FORMAT = 1


def source_key(paths: Iterable[Path], *extra: object) -> str:
    """A short hex key for a set of source files (name, size, mtime) and extra settings."""
    digest = hashlib.sha256(f"v{CACHE_FORMAT}".encode())
    for path in sorted(Path(p) for p in paths):
        stat = path.stat()
        digest.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    for item in extra:
        digest.update(f"{item!r}\n".encode())
    return digest.hexdigest()[:16]


def cached_arrays(
    cache_dir: Path | None,
    stem: str,
    key: str,
    build: Callable[[], Mapping[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """Arrays from ``<cache_dir>/<stem>-<key>.npz`` if present and readable, else ``build()`` (then stored).

    With ``cache_dir=None`` nothing is read or written. A corrupt cache file is rebuilt, not trusted.
    """
    if cache_dir is None:
        return dict(build())
    path = Path(cache_dir) / f"{stem}-{key}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as stored:
                return {name: stored[name] for name in stored.files}
        except (OSError, ValueError, zipfile.BadZipFile, KeyError):
            pass
    arrays = dict(build())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=".npz.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return arrays
