"""Tokenise once: the token ids of a dataset's texts, cached on disk per data file and tokenizer.

A :class:`TokenTable` holds each distinct text (a question, or a passage's (title, text) pair) tokenised
alone and unpadded, exactly as :func:`dpr.models.tokenization.tokenize_each` tokenises it (same truncation,
prefix and pair rule), so :meth:`TokenTable.pad` of any rows equals :func:`~dpr.models.inference.tokenize_batch`
of those texts, tensor for tensor (tests/models/test_token_cache.py checks it). Training reads its batches
from it (`dpr.training.batching`): no tokenizer call between steps. Anyone may use it for texts they
encode or score more than once: :func:`cached_table` (the disk cache) or :func:`build_table` (memory only),
then :meth:`TokenTable.pad`; `dpr.models.inference.encode_texts` accepts one (``tokens=``).

On disk: ``<data file's dir>/token_cache/<data file>.<what>.<key>/`` holds ``ids.npy`` / ``types.npy`` /
``offsets.npy`` (the rows, concatenated), ``keys.npy`` (each text's 16-byte BLAKE2b digest, in row order: never
the texts themselves, so a corpus's table is not a second copy of the corpus) and ``manifest.json``,
written last (atomically), with a fingerprint like every stage's (`dpr.stages.fingerprint`): the parameters
(the tokenizer's fingerprint, max length, prefix, the texts' digest) and the data file's size and mtime. A cache
is reused only when its manifest's fingerprint equals the one wanted now; a changed data file or tokenizer is
refused (:class:`StaleTokenCache`) and the table rebuilt. ``<key>`` hashes the parameters, so two tokenizers'
tables live side by side.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from dpr.atomic import write_json_atomic
from dpr.stages import fingerprint

log = logging.getLogger(__name__)

CACHE_DIR = "token_cache"
FORMAT = 2  # bump when the layout or the tokenisation rule changes: older caches are then refused
_SEP = "\x1f"  # between a passage's title and text in its key (never inside either)


class StaleTokenCache(ValueError):
    """A cache on disk that was made for other data, another tokenizer or other settings."""


def text_key(text: str, title: str | None = None) -> str:
    """The text (and its title: "" or None for none) as one string, which :func:`key_digest` hashes."""
    return f"{title or ''}{_SEP}{text}"


def key_digest(key: str) -> bytes:
    """The table's key of a :func:`text_key`: 16 bytes (a collision among 21M passages: odds ~1e-24)."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _as_digest(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key_digest(key)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What the tokenizer does to text, hashed: the fast tokenizer's whole spec (vocabulary, normaliser,
    pre-tokeniser, post-processor) without its truncation/padding state (set per call), or a slow one's vocabulary;
    plus its class, padding side and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
    else:
        spec = sorted(tokenizer.get_vocab().items())
    extra = {"class": type(tokenizer).__name__, "padding_side": getattr(tokenizer, "padding_side", "right"),
             "special": {k: str(v) for k, v in sorted(getattr(tokenizer, "special_tokens_map", {}).items())},
             "inputs": list(getattr(tokenizer, "model_input_names", []))}
    blob = json.dumps({"spec": spec, **extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class TokenTable:
    """Distinct texts tokenised alone, unpadded: row ``i`` is ``ids[offsets[i]:offsets[i+1]]``."""

    keys: np.ndarray           # S16: each row's text digest (key_digest), in row order
    ids: np.ndarray            # int32, all rows concatenated
    types: np.ndarray | None   # int8 token type ids (None: the tokenizer has none)
    offsets: np.ndarray        # int64, len(keys) + 1
    pad_id: int
    pad_type_id: int = 0
    left_padding: bool = False

    def __post_init__(self) -> None:
        self.keys = np.asarray(self.keys, dtype="S16")
        # a sorted copy searched by bisection: 24 bytes a row, where a dict of the digests would take ~100
        self._order = np.argsort(self.keys, kind="stable")
        self._sorted = self.keys[self._order]

    def __len__(self) -> int:
        return len(self.keys)

    def _find(self, digests: Sequence[bytes]) -> np.ndarray:
        """The rows of these digests, -1 where absent."""
        want = np.asarray(digests, dtype="S16")
        if not len(self._sorted):
            return np.full(len(want), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted, want), len(self._sorted) - 1)
        return np.where(self._sorted[at] == want, self._order[at], -1).astype(np.int64)

    def row(self, text: str, title: str | None = None) -> int | None:
        """The row of a text (with its title), or None where the table does not hold it."""
        r = int(self._find([key_digest(text_key(text, title))])[0])
        return None if r < 0 else r

    def rows(self, texts: Sequence[str], titles: Sequence[str | None] | None = None) -> list[int] | None:
        """The rows of ``texts`` (None where one is missing: the caller tokenises that batch instead)."""
        if not len(texts):
            return []
        found = self._find([key_digest(text_key(t, titles[i] if titles is not None else None))
                            for i, t in enumerate(texts)])
        return None if (found < 0).any() else found.tolist()

    def lengths(self, rows: Sequence[int]) -> np.ndarray:
        r = np.asarray(rows, dtype=np.int64)
        return self.offsets[r + 1] - self.offsets[r]

    def pad(self, rows: Sequence[int]) -> dict[str, torch.Tensor]:
        """The rows padded to their longest: what the tokenizer returns for those texts with
        ``padding="longest", return_tensors="pt"`` (int64 ``input_ids``, ``token_type_ids``, ``attention_mask``)."""
        lens = self.lengths(rows)
        n, width = len(rows), int(lens.max()) if len(rows) else 0
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.full((n, width), self.pad_type_id, dtype=np.int64) if self.types is not None else None
        for j, (r, length) in enumerate(zip(rows, lens.tolist())):
            lo = int(self.offsets[r])
            cols = slice(width - length, width) if self.left_padding else slice(0, length)
            ids[j, cols] = self.ids[lo:lo + length]
            mask[j, cols] = 1
            if types is not None:
                types[j, cols] = self.types[lo:lo + length]
        out = {"input_ids": torch.from_numpy(ids)}
        if types is not None:
            out["token_type_ids"] = torch.from_numpy(types)
        out["attention_mask"] = torch.from_numpy(mask)
        return out


Pairs = Callable[[], Iterable[tuple[str, "str | None"]]]  # (text, title) of each text, read again on each call


def _pairs(texts: Sequence[str], titles: Sequence[str | None] | None) -> Pairs:
    return lambda: zip(texts, titles if titles is not None else (None for _ in texts))


def _distinct(pairs: Iterable[tuple[str, str | None]]) -> Iterator[tuple[bytes, str, str] | tuple[bytes, None, None]]:
    """``(digest, text, title)`` of each text seen for the first time, ``(digest, None, None)`` for a repeat:
    streamed, holding the digests seen so far and no text."""
    seen: set[bytes] = set()
    for text, title in pairs:
        d = key_digest(text_key(text, title or ""))
        if d in seen:
            continue
        seen.add(d)
        yield d, text, title or ""


def distinct_digests(pairs: Iterable[tuple[str, str | None]]) -> list[bytes]:
    """The distinct texts' digests in first-seen order (a table's keys)."""
    return [d for d, _, _ in _distinct(pairs)]


def build_table(tokenizer: Any, texts: Sequence[str] | None, titles: Sequence[str | None] | None, max_length: int,
                prefix: str = "", chunk: int = 8192, *, pairs: Pairs | None = None,
                has_titles: bool | None = None) -> TokenTable:
    """Tokenise the distinct texts: :func:`~dpr.models.tokenization.tokenize_each`'s rows. ``pairs`` (instead of
    ``texts``/``titles``) streams them: only ``chunk`` texts at a time are held."""
    from dpr.models.tokenization import tokenize_each

    if pairs is None:
        pairs, has_titles = _pairs(texts, titles), titles is not None
    keys: list[bytes] = []
    ids, types, lens = [], [], []
    todo: list[tuple[str, str]] = []

    def flush() -> None:
        rows = tokenize_each(tokenizer, [t for t, _ in todo], [ti for _, ti in todo] if has_titles else None,
                             max_length, prefix)
        for r in rows:
            ids.append(np.asarray(r["input_ids"], dtype=np.int32))
            lens.append(len(r["input_ids"]))
            if "token_type_ids" in r:
                types.append(np.asarray(r["token_type_ids"], dtype=np.int8))
        todo.clear()

    for d, text, title in _distinct(pairs()):
        keys.append(d)
        todo.append((text, title))
        if len(todo) >= chunk:
            flush()
    if todo:
        flush()
    offsets = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(np.int64)
    return TokenTable(keys, np.concatenate(ids) if ids else np.zeros(0, np.int32),
                      np.concatenate(types) if types and len(types) == len(ids) else None, offsets,
                      **_pad_settings(tokenizer))


def _pad_settings(tokenizer: Any) -> dict:
    return {"pad_id": int(tokenizer.pad_token_id or 0), "pad_type_id": int(getattr(tokenizer, "pad_token_type_id", 0)),
            "left_padding": getattr(tokenizer, "padding_side", "right") == "left"}


def _digest(keys: Iterable[str | bytes]) -> str:
    h = hashlib.sha256()
    for k in keys:
        h.update(_as_digest(k))
    return h.hexdigest()


def table_params(tokenizer: Any, keys: Iterable[str | bytes], max_length: int, prefix: str, titles: bool) -> dict:
    """What a table depends on besides the data file (the texts enter by their digest)."""
    return {"format": FORMAT, "tokenizer": tokenizer_fingerprint(tokenizer), "max_length": int(max_length),
            "prefix": prefix, "pairs": bool(titles), "texts": _digest(keys), **_pad_settings(tokenizer)}


def save_table(table: TokenTable, directory: Path, want: str, params: dict) -> None:
    """Write the table into ``directory`` (replacing it), the manifest last: a half-written cache has none."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "ids.npy", table.ids)
    np.save(tmp / "offsets.npy", table.offsets)
    if table.types is not None:
        np.save(tmp / "types.npy", table.types)
    np.save(tmp / "keys.npy", table.keys)
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    write_json_atomic(directory / "manifest.json", {"fingerprint": want, "params": params, "rows": len(table)})


def load_table(directory: Path, want: str) -> TokenTable:
    """The table in ``directory`` if its manifest's fingerprint is ``want``; :class:`StaleTokenCache` otherwise
    (FileNotFoundError where there is none)."""
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    if manifest.get("fingerprint") != want:
        raise StaleTokenCache(f"{directory}: made for other data or another tokenizer (fingerprint "
                              f"{str(manifest.get('fingerprint'))[:12]}, wanted {want[:12]})")
    p = manifest["params"]
    types = directory / "types.npy"
    # the token ids memory-mapped: a rank's memory holds the pages of the rows it pads, not the whole table
    table = TokenTable(np.load(directory / "keys.npy"), np.load(directory / "ids.npy", mmap_mode="r"),
                       np.load(types, mmap_mode="r") if types.is_file() else None,
                       np.load(directory / "offsets.npy"), p["pad_id"], p["pad_type_id"], p["left_padding"])
    if len(table) != manifest.get("rows") or len(table.offsets) != len(table) + 1:
        raise ValueError(f"{directory}: {len(table)} keys for {manifest.get('rows')} rows")
    return table


def cache_path(data_file: Path, what: str, params: dict) -> Path:
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    return Path(data_file).parent / CACHE_DIR / f"{Path(data_file).name}.{what}.{key}"


def cached_table(data_file: str | Path, what: str, tokenizer: Any, texts: Sequence[str] | None,
                 titles: Sequence[str | None] | None, *, max_length: int, prefix: str = "",
                 write: bool = True, pairs: Pairs | None = None, has_titles: bool | None = None
                 ) -> tuple[TokenTable, bool]:
    """``(table, reused)``: the table of ``texts`` (from ``data_file``; ``what`` names which of its texts, e.g.
    ``questions``), read from its cache when that is up to date, else built (and, with ``write``, cached; a
    data directory that cannot be written keeps it in memory). ``pairs`` (with ``has_titles``) instead of
    ``texts``/``titles``: the ``(text, title)`` pairs streamed, read twice (their digests, then their tokens)."""
    if pairs is None:
        pairs, has_titles = _pairs(texts, titles), titles is not None
    params = table_params(tokenizer, distinct_digests(pairs()), max_length, prefix, bool(has_titles))
    directory = cache_path(Path(data_file), what, params)
    want = fingerprint(params, [data_file])
    try:
        return load_table(directory, want), True
    except FileNotFoundError:
        pass
    except StaleTokenCache as err:
        log.info("token cache refused, rebuilding it: %s", err)
    except (OSError, ValueError, KeyError) as err:  # a damaged cache: rebuilt, never trusted
        log.warning("token cache %s unreadable (%s): rebuilding it", directory, err)
    table = build_table(tokenizer, None, None, max_length, prefix, pairs=pairs, has_titles=bool(has_titles))
    if write:
        try:
            save_table(table, directory, want, params)
        except OSError as err:
            log.warning("token cache %s not written (%s): kept in memory", directory, err)
    return table, False
