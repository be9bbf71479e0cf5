"""Tokenise once: the token ids of a dataset's texts, cached on disk per data file and tokenizer.

A :class:`TokenTable` holds each distinct text (a question, or a passage's (title, text) pair) tokenised
alone and unpadded, exactly as :func:`dpr.models.inference.tokenize_each` tokenises it (same truncation,
prefix and pair rule), so :meth:`TokenTable.pad` of any rows equals :func:`~dpr.models.inference.tokenize_batch`
of those texts, tensor for tensor (tests/models/test_token_cache.py checks it). Training reads its batches
from it (`dpr.training.batching`): no tokenizer call between steps. Anyone may use it for texts they
encode or score more than once: :func:`cached_table` (the disk cache) or :func:`build_table` (memory only),
then :meth:`TokenTable.pad`; `dpr.models.inference.encode_texts` accepts one (``tokens=``).

On disk: ``<data file's dir>/token_cache/<data file>.<what>.<key>/`` holds ``ids.npy`` / ``types.npy`` /
``offsets.npy`` (the rows, concatenated), ``keys.json`` (the texts, in row order) and ``manifest.json``,
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
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from dpr.atomic import write_json_atomic
from dpr.stages import fingerprint

log = logging.getLogger(__name__)

CACHE_DIR = "token_cache"
FORMAT = 1  # bump when the layout or the tokenisation rule changes: older caches are then refused
_SEP = "\x1f"  # between a passage's title and text in its key (never inside either)


class StaleTokenCache(ValueError):
    """A cache on disk that was made for other data, another tokenizer or other settings."""


def text_key(text: str, title: str | None = None) -> str:
    """The table's key of a text (and its title: "" or None for none)."""
    return f"{title or ''}{_SEP}{text}"


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

    keys: list[str]
    ids: np.ndarray            # int32, all rows concatenated
    types: np.ndarray | None   # int8 token type ids (None: the tokenizer has none)
    offsets: np.ndarray        # int64, len(keys) + 1
    pad_id: int
    pad_type_id: int = 0
    left_padding: bool = False

    def __post_init__(self) -> None:
        self.index = {k: i for i, k in enumerate(self.keys)}

    def __len__(self) -> int:
        return len(self.keys)

    def row(self, text: str, title: str | None = None) -> int | None:
        """The row of a text (with its title), or None where the table does not hold it."""
        return self.index.get(text_key(text, title))

    def rows(self, texts: Sequence[str], titles: Sequence[str | None] | None = None) -> list[int] | None:
        """The rows of ``texts`` (None as soon as one is missing: the caller tokenises that batch instead)."""
        out = []
        for i, text in enumerate(texts):
            r = self.index.get(text_key(text, titles[i] if titles is not None else None))
            if r is None:
                return None
            out.append(r)
        return out

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


def _distinct(texts: Sequence[str], titles: Sequence[str | None] | None) -> tuple[list[str], list[str], list[str]]:
    """Distinct (key, text, title) in first-seen order."""
    seen: dict[str, tuple[str, str]] = {}
    for i, text in enumerate(texts):
        title = (titles[i] if titles is not None else None) or ""
        seen.setdefault(text_key(text, title), (text, title))
    keys = list(seen)
    return keys, [seen[k][0] for k in keys], [seen[k][1] for k in keys]


def build_table(tokenizer: Any, texts: Sequence[str], titles: Sequence[str | None] | None, max_length: int,
                prefix: str = "", chunk: int = 8192) -> TokenTable:
    """Tokenise the distinct texts (in memory): :func:`~dpr.models.inference.tokenize_each`'s rows."""
    from dpr.models.inference import tokenize_each

    keys, uniq, uniq_titles = _distinct(texts, titles)
    has_titles = titles is not None
    ids, types, lens = [], [], []
    for start in range(0, len(uniq), chunk):
        rows = tokenize_each(tokenizer, uniq[start:start + chunk],
                             uniq_titles[start:start + chunk] if has_titles else None, max_length, prefix)
        for r in rows:
            ids.append(np.asarray(r["input_ids"], dtype=np.int32))
            lens.append(len(r["input_ids"]))
            if "token_type_ids" in r:
                types.append(np.asarray(r["token_type_ids"], dtype=np.int8))
    offsets = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(np.int64)
    return TokenTable(keys, np.concatenate(ids) if ids else np.zeros(0, np.int32),
                      np.concatenate(types) if types and len(types) == len(ids) else None, offsets,
                      **_pad_settings(tokenizer))


def _pad_settings(tokenizer: Any) -> dict:
    return {"pad_id": int(tokenizer.pad_token_id or 0), "pad_type_id": int(getattr(tokenizer, "pad_token_type_id", 0)),
            "left_padding": getattr(tokenizer, "padding_side", "right") == "left"}


def _digest(keys: Iterable[str]) -> str:
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def table_params(tokenizer: Any, keys: Sequence[str], max_length: int, prefix: str, titles: bool) -> dict:
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
    (tmp / "keys.json").write_text(json.dumps(table.keys), encoding="utf-8")
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
    return TokenTable(json.loads((directory / "keys.json").read_text(encoding="utf-8")),
                      np.load(directory / "ids.npy"), np.load(types) if types.is_file() else None,
                      np.load(directory / "offsets.npy"), p["pad_id"], p["pad_type_id"], p["left_padding"])


def cache_path(data_file: Path, what: str, params: dict) -> Path:
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    return Path(data_file).parent / CACHE_DIR / f"{Path(data_file).name}.{what}.{key}"


def cached_table(data_file: str | Path, what: str, tokenizer: Any, texts: Sequence[str],
                 titles: Sequence[str | None] | None, *, max_length: int, prefix: str = "",
                 write: bool = True) -> tuple[TokenTable, bool]:
    """``(table, reused)``: the table of ``texts`` (from ``data_file``; ``what`` names which of its texts, e.g.
    ``questions``), read from its cache when that is up to date, else built (and, with ``write``, cached; a
    data directory that cannot be written keeps it in memory)."""
    keys, _, _ = _distinct(texts, titles)
    params = table_params(tokenizer, keys, max_length, prefix, titles is not None)
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
    table = build_table(tokenizer, texts, titles, max_length, prefix)
    if write:
        try:
            save_table(table, directory, want, params)
        except OSError as err:
            log.warning("token cache %s not written (%s): kept in memory", directory, err)
    return table, False
