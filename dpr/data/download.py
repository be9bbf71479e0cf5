"""Resumable HTTP downloads, gunzipped as they stream.

The published bytes go to ``<dest>.part`` (``<dest>.gz.part`` for a gzip file), appended as they arrive; a
dropped connection is resumed with an HTTP ``Range`` request from the bytes already there, within the same
call (`ATTEMPTS` tries) or by the next run. A gzip file is inflated while it streams, so the stored file is
the decompressed one; after an interruption the kept compressed part is inflated again (local, fast) to
restore the decompressor's state, then the download continues. The compressed part is deleted once the
file is complete. Size, sha256 and line count of both the published and the stored bytes are taken on the
way (`Fetched`), so no file is read twice.
"""

from __future__ import annotations

import http.client
import logging
import os
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from tqdm.auto import tqdm

from dpr.atomic import atomic_path, path_lock
from dpr.data.ledger import Digest, Tap
from dpr.errors import DataError

log = logging.getLogger(__name__)

ATTEMPTS = 5
BLOCK = 1 << 20
TIMEOUT_S = 60


@dataclass(frozen=True)
class Fetched:
    """The stored file's digest, and where its bytes came from (url or path, and the published bytes' digest)."""

    digest: Digest
    source: dict


class _Sink:
    """Where the stored bytes go: a file, gunzipped first when ``gunzip`` (multi-member gzip included)."""

    def __init__(self, out: BinaryIO, gunzip: bool, name: str) -> None:
        self.out, self.gunzip, self.name = out, gunzip, name
        self.tap = Tap()
        self.inflater = zlib.decompressobj(31) if gunzip else None

    def write(self, block: bytes) -> None:
        if self.inflater is None:
            self._emit(block)
            return
        while block:
            try:
                self._emit(self.inflater.decompress(block))
            except zlib.error as err:
                raise DataError(self.name, f"not a valid gzip stream ({err})", field="gzip") from None
            block = self.inflater.unused_data if self.inflater.eof else b""
            if block:  # a concatenated gzip member follows
                self.inflater = zlib.decompressobj(31)

    def _emit(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.tap.update(data)

    def finish(self) -> Digest:
        if self.inflater is not None:
            if not self.inflater.eof:
                raise DataError(self.name, "the gzip stream ends early (file cut short?)", field="gzip")
            self._emit(self.inflater.flush())
        self.out.flush()
        return self.tap.digest()


def inflate_file(src: Path, dest: Path, gunzip: bool = True, check: Callable[[Fetched], None] | None = None) -> Fetched:
    """Decompress (or copy) a local file into ``dest`` atomically, with both digests; ``check`` as in `download`."""
    raw = Tap()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as out, open(src, "rb") as f, \
                tqdm(total=src.stat().st_size, unit="B", unit_scale=True, desc=src.name, disable=None) as bar:
            sink = _Sink(out, gunzip, str(src))
            while block := f.read(BLOCK):
                raw.update(block)
                sink.write(block)
                bar.update(len(block))
            digest = sink.finish()
        r = raw.digest()
        fetched = Fetched(digest, {"path": str(src), "size": r.size, "sha256": r.sha256})
        if check is not None:
            check(fetched)
    return fetched


def download(url: str, dest: Path, gunzip: bool, attempts: int | None = None,
             check: Callable[[Fetched], None] | None = None) -> Fetched | None:
    """Download ``url`` into ``dest`` (gunzipped when ``gunzip``), resuming a part left by an earlier run.

    ``check(fetched)`` runs before the file is moved onto ``dest``: when it raises, ``dest`` is untouched and
    the download is discarded. After ``attempts`` (default `ATTEMPTS`) failed tries the part is kept for the
    next run. None: another process finished the same download while this one waited for its lock.
    """
    attempts = attempts or ATTEMPTS
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with path_lock(dest):  # re-entrant: atomic_path below takes the same lock
        if dest.is_file():
            return None
        return _download_locked(url, dest, gunzip, attempts, check)


def _download_locked(url: str, dest: Path, gunzip: bool, attempts: int,
                     check: Callable[[Fetched], None] | None) -> Fetched:
    part = dest.with_name(dest.name + (".gz.part" if gunzip else ".part"))
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as out:
            sink = _Sink(out, gunzip, url)
            raw = _resume(part, sink)
            with open(part, "ab") as keep:
                _transfer(url, part, keep, raw, sink, attempts)
            fetched = Fetched(sink.finish(), {"url": url, "size": raw.size, "sha256": raw.hash.hexdigest()})
        if check is not None:
            try:
                check(fetched)
            except DataError:
                part.unlink(missing_ok=True)  # a whole file that fails its check: the next run starts afresh
                raise
        if not gunzip:
            os.replace(part, tmp)  # the part is the file: no second copy
    part.unlink(missing_ok=True)
    return fetched


def _resume(part: Path, sink: _Sink) -> Tap:
    """Feed the bytes an earlier run kept through the digest (and the decompressor); returns the raw tap."""
    raw = Tap()
    if not part.is_file() or part.stat().st_size == 0:
        return raw
    log.info("resuming %s from %d bytes already downloaded", part.name, part.stat().st_size)
    gunzip = sink.inflater is not None
    with open(part, "rb") as f:
        while block := f.read(BLOCK):
            raw.update(block)
            if gunzip:
                sink.write(block)
            else:
                sink.tap.update(block)  # the part is the stored file itself: nothing to copy
    return raw


def _restart(part: Path, keep: BinaryIO, raw: Tap, sink: _Sink) -> Tap:
    """Start over (the server ignored the Range request, or the part is longer than the file)."""
    keep.truncate(0)
    sink.out.seek(0)
    sink.out.truncate(0)
    sink.tap = Tap()
    if sink.inflater is not None:
        sink.inflater = zlib.decompressobj(31)
    log.warning("%s: the server does not resume here; downloading from the start", part.name)
    return Tap()


def _transfer(url: str, part: Path, keep: BinaryIO, raw: Tap, sink: _Sink, attempts: int) -> None:
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        headers = {"Range": f"bytes={raw.size}-"} if raw.size else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as resp:
                if raw.size and resp.status != 206:
                    raw = _restart(part, keep, raw, sink)
                length = resp.headers.get("Content-Length")
                total = raw.size + int(length) if length is not None else None
                with tqdm(total=total, initial=raw.size, unit="B", unit_scale=True, desc=part.name[:-5],
                          disable=None) as bar:
                    while block := resp.read1(BLOCK):  # what has arrived: a stalled server loses us nothing
                        keep.write(block)
                        keep.flush()  # on disk before it counts: a killed run resumes from what is there
                        raw.update(block)
                        if sink.inflater is not None:
                            sink.write(block)
                        else:
                            sink.tap.update(block)
                        bar.update(len(block))
                keep.flush()
                if total is not None and raw.size < total:
                    raise http.client.IncompleteRead(b"", total - raw.size)
            return
        except urllib.error.HTTPError as err:
            if err.code == 416 and raw.size:  # the part is not a prefix of what the server has now
                raw = _restart(part, keep, raw, sink)
                last = err
                continue
            if err.code < 500:
                raise DataError(url, f"download failed (HTTP {err.code} {err.reason})", field="url") from None
            last = err
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            last = err
        keep.flush()
        log.warning("%s: connection lost at %d bytes (%s); resuming (try %d of %d)", part.name[:-5], raw.size,
                    getattr(last, "reason", last), attempt, attempts)
        time.sleep(min(2 ** (attempt - 1) - 1, 30))
    raise DataError(url, f"download failed after {attempts} tries ({getattr(last, 'reason', last)}); "
                    f"{raw.size} bytes are kept in {part}: run again to resume, or set DPR_DATA_MIRROR / "
                    "data.mirror_dir to a local copy", field="url")
