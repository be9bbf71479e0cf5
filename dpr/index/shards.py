"""The on-disk format of passage embeddings: shards written by `dpr-encode`, read by `dpr-index`.

A shard ``shard_{i:03d}_of_{n:03d}`` is three files in one directory:

- ``<stem>.npy``      — ``[count, dim]`` float16 or float32 vectors, row ``r`` = passage ``ids[r]``;
- ``<stem>.ids.txt``  — one passage id per line, same order;
- ``<stem>.json``     — the manifest, written last: a shard is finished exactly when its manifest
  exists and agrees with the other two files (``count``, ``dim``, ``dtype``).

Shard ``i`` of ``n`` holds the contiguous passage range ``shard_range(total, i, n)``, so the
concatenation of shards 0..n-1 is the passages file in order, every passage exactly once.
Manifests written by `dpr-encode` record that range (``start``, ``end``, ``total``) and the content
fingerprints of the passages file and the model (`dpr.index.fingerprint`); `list_shards` refuses
shards that disagree on them, ranges that leave a gap or overlap, and `iter_batches` refuses
non-finite vectors, naming the shard file and the row.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from dpr.atomic import write_json_atomic
from dpr.config import recorded_later
from dpr.encode_config import EncodeConfig
from dpr.errors import DataError

FORMAT = "dpr-embeddings/1"
_MANIFEST_RE = re.compile(r"^shard_(\d{3,})_of_(\d{3,})\.json$")


def shard_stem(shard_id: int, num_shards: int) -> str:
    """``shard_002_of_008``: zero-padded so that names sort in shard order."""
    return f"shard_{shard_id:03d}_of_{num_shards:03d}"


def shard_range(total: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """Half-open passage range ``[start, end)`` of one shard.

    Boundaries are ``floor(i * total / n)``: contiguous, sizes differ by at most one, every
    passage lands in exactly one shard, and shards beyond the corpus (n > total) are empty.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    return shard_id * total // num_shards, (shard_id + 1) * total // num_shards


def shards_for_rank(num_shards: int, rank: int, world_size: int) -> list[int]:
    """The shards one process encodes under torchrun: ``i % world_size == rank``."""
    return [i for i in range(num_shards) if i % world_size == rank]


@dataclass(frozen=True)
class ShardFiles:
    """Paths of one shard's files inside an embeddings directory."""

    directory: Path
    stem: str

    @classmethod
    def of(cls, directory: str | Path, shard_id: int, num_shards: int) -> "ShardFiles":
        return cls(Path(directory), shard_stem(shard_id, num_shards))

    @property
    def vectors(self) -> Path:
        return self.directory / f"{self.stem}.npy"

    @property
    def ids(self) -> Path:
        return self.directory / f"{self.stem}.ids.txt"

    @property
    def manifest(self) -> Path:
        return self.directory / f"{self.stem}.json"


def read_ids(path: str | Path) -> list[str]:
    """Passage ids, one per line (an empty file is an empty shard)."""
    text = Path(path).read_text(encoding="utf-8")
    return text.split("\n")[:-1] if text else []


class IdList(Sequence[str]):
    """Passage ids held as one UTF-8 buffer and their offsets (the ``.ids`` file's bytes plus 4 or 8 bytes an id)
    instead of one Python string each (~60 bytes an id: 1.3 GB for 21M passages); an id is decoded when read.
    Equal to any sequence of the same ids, in order."""

    def __init__(self, data: bytes, starts: np.ndarray) -> None:
        self._data, self._starts = data, starts  # starts: n + 1 offsets, the last one past the final newline

    @classmethod
    def read(cls, path: str | Path) -> "IdList":
        data = Path(path).read_bytes()
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)  # one id per line
        if data and (not len(ends) or ends[-1] != len(data) - 1):
            raise DataError(path, "the last id has no newline (a truncated ids file?)")
        starts = np.empty(len(ends) + 1, dtype=np.uint32 if len(data) < 2 ** 32 else np.int64)
        starts[0] = 0
        starts[1:] = ends + 1
        return cls(data, starts)

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"id {i} out of range ({n} ids)")
        return self._data[int(self._starts[i]):int(self._starts[i + 1]) - 1].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        for a in range(0, len(self), 65_536):  # decoded a block at a time: never every id as a string at once
            b = min(a + 65_536, len(self))
            yield from self._data[int(self._starts[a]):int(self._starts[b])].decode("utf-8").split("\n")[:-1]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdList):
            return self._data == other._data
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdList({len(self)} ids)"


def write_ids(path: str | Path, ids: list[str]) -> None:
    """One id per line; ids come from passages.tsv, which cannot hold tabs or newlines in a field."""
    with open(path, "w", encoding="utf-8") as f:
        for pid in ids:
            f.write(pid)
            f.write("\n")


def check_shard(files: ShardFiles) -> dict | None:
    """The manifest of a finished shard, or None when the shard is absent, partial or inconsistent.

    Cheap: reads the manifest, the ``.npy`` header and counts id lines; never loads the vectors.
    """
    try:
        manifest = json.loads(files.manifest.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT:
            return None
        arr = np.load(files.vectors, mmap_mode="r")
        count, dim = int(manifest["count"]), int(manifest["dim"])
        if arr.ndim != 2 or arr.shape != (count, dim) or str(arr.dtype) != manifest["dtype"]:
            return None
        with open(files.ids, "rb") as f:
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        if lines != count:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        # RecursionError: a manifest nested too deeply for the JSON decoder; AttributeError: valid JSON that is no
        # object. Either way not a finished shard of ours: absent, so a resumed encode redoes it
        return None
    return manifest


@dataclass(frozen=True)
class Shard:
    files: ShardFiles
    manifest: dict

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    def vectors(self) -> np.ndarray:
        """Memory-mapped ``[count, dim]`` array in the stored dtype."""
        return np.load(self.files.vectors, mmap_mode="r")

    def ids(self) -> list[str]:
        return read_ids(self.files.ids)


def list_shards(embeddings_dir: str | Path) -> list[Shard]:
    """Every shard of a complete embeddings directory, in shard order.

    Raises DataError when shards are missing or unfinished, or disagree on num_shards, dim, dtype,
    model or normalisation: an index over half a corpus would silently lose passages.
    """
    root = Path(embeddings_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"embeddings directory not found: {root}")
    found: dict[int, set[int]] = {}
    for p in root.iterdir():
        m = _MANIFEST_RE.match(p.name)
        if m:
            found.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    if not found:
        raise DataError(root, "no finished shards (shard_XXX_of_YYY.json); run dpr-encode first")
    if len(found) > 1:
        raise DataError(root, f"shards from different num_shards runs mixed: {sorted(found)}", field="num_shards")
    (num_shards, present), = found.items()
    missing = sorted(set(range(num_shards)) - present)
    if missing:
        raise DataError(root, f"{len(missing)} of {num_shards} shards missing or unfinished: {missing[:20]}; "
                        "run dpr-encode for them", field="shard_id")
    shards = []
    for i in range(num_shards):
        files = ShardFiles.of(root, i, num_shards)
        manifest = check_shard(files)
        if manifest is None:
            raise DataError(files.manifest, "shard files disagree with the manifest (interrupted write?); "
                            "delete the manifest and rerun dpr-encode")
        shards.append(Shard(files, manifest))
    first = shards[0].manifest
    for s in shards[1:]:
        for key in AGREED_KEYS:
            mine, theirs = s.manifest.get(key, _UNRECORDED.get(key)), first.get(key, _UNRECORDED.get(key))
            if mine != theirs:
                raise DataError(s.files.manifest, f"differs from shard 0 ({shards[0].files.manifest.name}): "
                                f"{mine!r} != {theirs!r}; shards of one index must come "
                                "from one passages file and one model: re-encode the stale ones", field=key)
    check_ranges(shards)
    return shards


# Every shard of one index must agree on these (fingerprints: `dpr.index.fingerprint`).
AGREED_KEYS = ("dim", "dtype", "model", "normalized", "model_fingerprint", "passages_sha256", "total", "weights",
               "compile")
# What a shard written before a key was recorded had (dpr-encode's fp32 weights, `dpr.models.weights`; eager,
# `dpr.models.compile`): declared on EncodeConfig's fields (``recorded_before``).
_UNRECORDED = recorded_later(EncodeConfig)


def check_ranges(shards: list[Shard]) -> None:
    """The shards' passage ranges join up to cover ``[0, total)`` exactly: no gap, no overlap.

    Shards without recorded ranges (written by `write_shard` from embeddings computed elsewhere) are
    taken in order as they are; a mix of both kinds is refused.
    """
    ranged = ["start" in s.manifest and "end" in s.manifest for s in shards]
    if not any(ranged):
        return
    if not all(ranged):
        bad = shards[ranged.index(False)]
        raise DataError(bad.files.manifest, "no passage range while other shards have one", field="start")
    pos = 0
    for s in shards:
        start, end = int(s.manifest["start"]), int(s.manifest["end"])
        if end - start != s.count:
            raise DataError(s.files.manifest, f"range [{start}, {end}) but {s.count} vectors", field="count")
        if start > pos:
            raise DataError(s.files.manifest, f"gap: passages [{pos}, {start}) are in no shard", field="start")
        if start < pos:
            raise DataError(s.files.manifest, f"overlap: passages [{start}, {pos}) are in two shards", field="start")
        pos = end
    total = shards[0].manifest.get("total")
    if total is not None and pos != int(total):
        raise DataError(shards[-1].files.manifest, f"shards cover [0, {pos}) of {total} passages", field="end")


def embeddings_info(shards: list[Shard]) -> dict:
    """Totals over shards: ``count``, ``dim``, ``dtype``, ``model``, ``normalized`` (and ``truncate_dim``,
    ``model_dim`` where the vectors are truncated)."""
    first = shards[0].manifest
    return {
        "count": sum(s.count for s in shards),
        "dim": int(first["dim"]),
        "dtype": first["dtype"],
        "model": first.get("model"),
        "model_fingerprint": first.get("model_fingerprint"),
        "passages_sha256": first.get("passages_sha256"),
        "normalized": bool(first.get("normalized", False)),
        "num_shards": len(shards),
        # Matryoshka-truncated shards (encode.dim, dense.dims): the model's full size beside the stored one
        **{k: first[k] for k in ("truncate_dim", "model_dim") if first.get(k) is not None},
    }


def iter_batches(shards: list[Shard], batch_size: int) -> Iterator[np.ndarray]:
    """float32 batches of at most ``batch_size`` rows across all shards, in passage order.

    Shards are memory-mapped and converted per batch, so memory stays at one batch however large
    the corpus is.
    """
    for shard in shards:
        arr = shard.vectors()
        for start in range(0, arr.shape[0], batch_size):
            batch = np.ascontiguousarray(arr[start:start + batch_size], dtype=np.float32)
            check_finite(shard, batch, start)
            yield batch


def check_finite(shard: Shard, batch: np.ndarray, offset: int) -> None:
    """A NaN or infinite vector would be indexed silently and poison every search near it: refuse it,
    naming the shard file, the row and the passage id."""
    finite = np.isfinite(batch).all(axis=1)
    if not finite.all():
        row = offset + int(np.argmin(finite))
        ids = shard.ids()
        pid = ids[row] if row < len(ids) else "?"
        raise DataError(shard.files.vectors, f"non-finite vector (NaN or inf) for passage {pid!r}; re-encode "
                        "this shard (dtype=float32 if float16 overflowed)", line=f"row {row}")


def gather_rows(shards: list[Shard], rows: np.ndarray) -> np.ndarray:
    """float32 vectors of the given global row numbers (sorted ascending), across shards."""
    offsets = np.cumsum([0] + [s.count for s in shards])
    parts = []
    for i, shard in enumerate(shards):
        lo, hi = np.searchsorted(rows, [offsets[i], offsets[i + 1]])
        if hi > lo:
            part = np.asarray(shard.vectors()[rows[lo:hi] - offsets[i]], dtype=np.float32)
            finite = np.isfinite(part).all(axis=1)
            if not finite.all():  # report the row in the shard, as iter_batches does
                bad = int(rows[lo:hi][np.argmin(finite)] - offsets[i])
                check_finite(shard, np.asarray(shard.vectors()[bad:bad + 1], dtype=np.float32), bad)
            parts.append(part)
    dim = int(shards[0].manifest["dim"])
    return np.concatenate(parts) if parts else np.zeros((0, dim), dtype=np.float32)


def commit_shard(files: ShardFiles, tmp_vectors: Path, tmp_ids: Path, manifest: dict) -> None:
    """Rename finished temp files into place, manifest last: until it exists the shard is unfinished."""
    files.manifest.unlink(missing_ok=True)  # a stale manifest must never vouch for new files
    os.replace(tmp_vectors, files.vectors)
    os.replace(tmp_ids, files.ids)
    write_json_atomic(files.manifest, {"format": FORMAT, **manifest})


def write_shard(directory: str | Path, shard_id: int, num_shards: int, vectors: np.ndarray,
                ids: list[str], **manifest: object) -> ShardFiles:
    """Write an in-memory shard (embeddings computed elsewhere, tests) in the `dpr-encode` format."""
    if vectors.ndim != 2 or vectors.shape[0] != len(ids):
        raise ValueError(f"vectors {list(vectors.shape)} do not match {len(ids)} ids")
    files = ShardFiles.of(directory, shard_id, num_shards)
    files.directory.mkdir(parents=True, exist_ok=True)
    tmp_vectors = files.directory / f".{files.stem}.npy.tmp"
    tmp_ids = files.directory / f".{files.stem}.ids.txt.tmp"
    with open(tmp_vectors, "wb") as f:
        np.save(f, vectors)
    write_ids(tmp_ids, ids)
    meta = {"shard_id": shard_id, "num_shards": num_shards, "count": len(ids), "dim": int(vectors.shape[1]),
            "dtype": str(vectors.dtype), "normalized": False, **manifest}
    commit_shard(files, tmp_vectors, tmp_ids, meta)
    return files


def read_embeddings(embeddings_dir: str | Path) -> tuple[list[str], np.ndarray]:
    """Every id and float32 vector of a complete embeddings directory, in corpus order (small corpora:
    it all goes to memory; the trainer starts from the untrained model's vectors with it)."""
    shards = list_shards(embeddings_dir)
    ids = [pid for shard in shards for pid in shard.ids()]
    return ids, gather_rows(shards, np.arange(len(ids)))
