"""Size and sha256 of every raw file a recipe reads without a digest in the registry, recorded at first sight.

DPR publishes no checksums for its files, so the first download (or the first read of a mirror copy, or of
the user's own ``data.passages``) records each file's size and sha256 in a ledger, ``sha256.lock.json`` in
the download cache; every later use compares against it and refuses a file that changed (`DataError`, one
line naming the file, exit 2): a silently edited or truncated 13 GB passage file would otherwise only show
up as a worse score. A user who holds published sums pins them (``data.sha256.<file>=<hex>``); a pin that
matches the file also replaces the recorded digest, which is how a deliberately changed file is accepted.

Hashing 13 GB takes about a minute, so a file is hashed once per version: the ledger keeps the digest with
the size, mtime and inode it was computed for, and hashes again only when one of them changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from dpr.atomic import atomic_path
from dpr.data._io import load_json_file
from dpr.errors import DataError

log = logging.getLogger(__name__)

LEDGER_NAME = "sha256.lock.json"
BLOCK = 1 << 20
_BAR_BYTES = 64 << 20  # no progress bar for files read in well under a second


@dataclass(frozen=True)
class Digest:
    size: int
    sha256: str
    lines: int  # newline-terminated lines, plus one for a last line without its newline

    def as_dict(self) -> dict:
        return {"size": self.size, "sha256": self.sha256, "lines": self.lines}


class Tap:
    """Running size, sha256 and line count of a byte stream (a download, a file being hashed)."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self.newlines = 0
        self.last = b"\n"

    def update(self, block: bytes) -> None:
        if block:
            self.hash.update(block)
            self.size += len(block)
            self.newlines += block.count(b"\n")
            self.last = block[-1:]

    def digest(self) -> Digest:
        return Digest(self.size, self.hash.hexdigest(), self.newlines + (self.last != b"\n"))


def digest_file(path: str | Path) -> Digest:
    """Size, sha256 and line count of ``path`` in one read (a progress bar for large files)."""
    path = Path(path)
    tap = Tap()
    size = path.stat().st_size
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}",
                                     disable=None if size >= _BAR_BYTES else True) as bar:
        while block := f.read(BLOCK):
            tap.update(block)
            bar.update(len(block))
    return tap.digest()


def _signature(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def load(ledger: Path) -> dict:
    """The ledger's ``{"files": {resolved path: entry}}`` ({} entries when there is none yet)."""
    if not ledger.is_file():
        return {"files": {}}
    data = load_json_file(ledger)
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise DataError(ledger, "expected {\"files\": {path: entry}}", field="files")
    return data


def _refuse(path: Path, name: str, what: str, got: str, want: str, origin: str) -> DataError:
    fix = f"restore the file, or accept this version with +data.sha256.{name}={got}" if what == "sha256" else \
        "restore the file (or delete it to fetch it again)"
    return DataError(path, f"{name} has {what} {got}, but {origin} says {want}; nothing was replaced: {fix}",
                     field=what)


def check(path: Path, name: str, actual: Digest, entry: dict | None, pin: str | None, ledger: Path) -> None:
    """Raise (one line) unless ``actual`` matches the pin, else the recorded digest (when there is one)."""
    if pin:
        if actual.sha256 != pin:
            raise _refuse(path, name, "sha256", actual.sha256, pin, f"data.sha256.{name}")
        return
    if entry is None:
        return
    if actual.size != entry.get("size"):
        raise _refuse(path, name, "size", str(actual.size), str(entry.get("size")), f"the digest recorded in {ledger}")
    if actual.sha256 != entry.get("sha256"):
        raise _refuse(path, name, "sha256", actual.sha256, str(entry.get("sha256")),
                      f"the digest recorded at its first use in {ledger}")


def check_source(path: Path, name: str, source: dict | None, pin: str | None) -> None:
    """A pin on the published (compressed) file: checked against the digest taken while it streamed in."""
    if not pin:
        return
    if not source or not source.get("sha256"):
        log.warning("data.sha256.%s: not checked (%s did not come from that file here)", name, path)
        return
    if source["sha256"] != pin:
        raise _refuse(Path(source.get("url") or path), name, "sha256", source["sha256"], pin, f"data.sha256.{name}")


def verify(ledger: Path, name: str, path: Path, pin: str | None = None, source_name: str | None = None,
           source_pin: str | None = None) -> Digest:
    """``path``'s digest, checked against its pin or its recorded digest (and recorded at first use).

    The file is hashed only when its size, mtime or inode differ from those of the last hash; a size that
    differs from the recorded one is refused without reading the file.
    """
    path = path.resolve()
    data = load(ledger)
    entry = data["files"].get(str(path))
    sig = _signature(path)
    seen = (entry or {}).get("seen") or {}
    if {k: seen.get(k) for k in sig} == sig and isinstance(seen.get("sha256"), str):
        actual = Digest(seen["size"], seen["sha256"], int(seen.get("lines", 0)))
    elif entry and not pin and sig["size"] != entry.get("size"):
        raise _refuse(path, name, "size", str(sig["size"]), str(entry.get("size")), f"the digest recorded in {ledger}")
    else:
        log.info("%s: hashing %s (%.2f GB, once per version of the file)", name, path, sig["size"] / 1e9)
        actual = digest_file(path)
    check(path, name, actual, entry, pin, ledger)
    if source_name:
        check_source(path, source_name, (entry or {}).get("source"), source_pin)
    record(ledger, name, path, actual, (entry or {}).get("source"), replace=entry is None or bool(pin),
           sig=sig if _signature(path) == sig else None)
    return actual


def record(ledger: Path, name: str, path: Path, digest: Digest, source: dict | None = None, replace: bool = True,
           sig: dict | None = None) -> None:
    """Write ``path``'s entry: the recorded digest (when ``replace``) and the version it was last hashed at."""
    path = path.resolve()
    sig = sig or _signature(path)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(ledger) as tmp:  # read, change and write under the ledger's lock: no entry lost to a race
        data = load(ledger)
        entry = data["files"].get(str(path)) or {}
        if replace or not entry:
            entry = {"name": name, **digest.as_dict(), "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     **({"source": source} if source else {})}
        entry["seen"] = {**sig, "sha256": digest.sha256, "lines": digest.lines}
        data["files"][str(path)] = entry
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=2)
            f.write("\n")


def entry_of(ledger: Path, path: Path) -> dict | None:
    return load(ledger)["files"].get(str(path.resolve()))


__all__ = ["Digest", "Tap", "digest_file", "verify", "check", "check_source", "record", "entry_of", "LEDGER_NAME"]
