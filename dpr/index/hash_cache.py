"""A file's sha256, hashed once per version of the file and remembered on disk.

The passages file's fingerprint (`dpr.index.fingerprint.passages_fingerprint`) is a sha256 of its bytes: 13 GB
for DPR's Wikipedia passages, about a minute of reading in every process that checks a shard or an index (each
torchrun rank, each encode array task, each retrieval). The digest is kept in a small JSON entry under the cache
directory, keyed by the file's resolved path and valid while its size, mtime and inode are those recorded; any
change (an edit, a touch, a replacement) hashes it again. The digest is the same sha256 either way, so every
fingerprint keeps its value.

The cache directory: ``$DPR_HASH_CACHE`` if set, else ``$XDG_CACHE_HOME/dpr/sha256`` (``~/.cache/dpr/sha256``).
Files below `MIN_CACHED_BYTES` are hashed each time (faster than a cache entry). A cache that cannot be read or
written is skipped (the file is hashed as before).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from dpr.atomic import sha256_file, write_json_atomic

log = logging.getLogger(__name__)

# Smaller files cost less to hash than to look up (and would fill the cache with model configs).
MIN_CACHED_BYTES = 64 << 20


def cache_dir() -> Path:
    """Where the digests are kept (module doc)."""
    if os.environ.get("DPR_HASH_CACHE"):
        return Path(os.environ["DPR_HASH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dpr" / "sha256"


def _signature(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _entry(path: Path) -> Path:
    return cache_dir() / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".json")


# the project's one file hash, under a name of this module's (what `cached_sha256` calls to read a file)
hash_file = sha256_file


def cached_sha256(path: str | os.PathLike) -> str:
    """The hex sha256 of ``path``: from the cache when the file's size, mtime and inode are those recorded,
    else hashed (and recorded, for a file of at least `MIN_CACHED_BYTES`)."""
    path = Path(path).resolve()
    sig = _signature(path)
    if sig["size"] < MIN_CACHED_BYTES:
        return hash_file(path)
    entry = _entry(path)
    try:
        found = json.loads(entry.read_text(encoding="utf-8"))
        if isinstance(found, dict) and {k: found.get(k) for k in sig} == sig and isinstance(found.get("sha256"), str):
            return found["sha256"]
    except (OSError, ValueError):
        pass  # no entry yet, or an unreadable one: hash the file
    log.info("hashing %s (%.1f GB; remembered in %s until the file changes)", path, sig["size"] / 1e9, cache_dir())
    digest = hash_file(path)
    if _signature(path) == sig:  # unchanged while it was read: the digest is this version's
        _store(entry, {**sig, "sha256": digest})
    return digest


def _store(entry: Path, record: dict) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(entry, record)
    except OSError as err:  # a read-only home: the next process hashes again, nothing else changes
        log.debug("cannot remember the digest in %s: %s", entry, err)
