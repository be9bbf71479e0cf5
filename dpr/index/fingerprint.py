"""Content fingerprints of what an embedding shard or an index was made from: the passages file and the model.

Shards (`dpr-encode`) and indexes (`dpr-index`) carry both in their JSON manifests, so that
`dpr-index` refuses to merge shards encoded from two versions of ``passages.tsv`` or by two models,
and `dpr-retrieve` refuses an index built by another model or from another passages file before it
encodes a single question (`check_index_matches`).

Fingerprints hash file contents, not names or modification times: copying a run directory keeps its
fingerprint, retraining into the same directory changes it. Results are memoised per process on
(path, size, mtime) so one command hashes each file once, and across commands by `dpr.index.hash_cache`
(a file is hashed again only once its size, mtime or inode changes).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from dpr.errors import DataError
from dpr.index.hash_cache import cached_sha256

# The files that make a model: weights, configs, the bi-encoder settings (pooling, similarity, projection).
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".pt")
# Tokenizer and training bookkeeping do not change the vectors a model computes.
_IGNORED = ("train_summary.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "trainer_state.json")
_memo: dict[tuple, str] = {}
log = logging.getLogger(__name__)


def _file_sha256(path: Path) -> str:
    st = path.stat()
    key = ("file", str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _memo:  # per process; across processes the digest is remembered on disk (hash_cache)
        _memo[key] = cached_sha256(path)
    return _memo[key]


def passages_fingerprint(passages_path: str | Path) -> str:
    """``sha256:<hex>`` of the passages file's bytes."""
    path = Path(passages_path)
    if not path.is_file():
        raise FileNotFoundError(f"passages file not found: {path}")
    return "sha256:" + _file_sha256(path)


def model_files(model_dir: Path) -> list[Path]:
    """The files of a model directory that determine its vectors, sorted (checkpoints/ excluded)."""
    return sorted(f for f in model_dir.rglob("*")
                  if f.is_file() and f.suffix in MODEL_FILE_SUFFIXES and f.name not in _IGNORED
                  and "checkpoints" not in f.relative_to(model_dir).parts
                  and not any(p.startswith(".") for p in f.relative_to(model_dir).parts))


def model_fingerprint(model_path: str | Path) -> str:
    """``sha256:<hex>`` over a local model directory's weight and config files (names and bytes);
    ``name:<id>`` for a hub name that is not a local directory."""
    path = Path(str(model_path))
    if not path.is_dir():
        return f"name:{model_path}"
    h = hashlib.sha256()
    for f in model_files(path):
        h.update(f"{f.relative_to(path).as_posix()}\t{_file_sha256(f)}\n".encode())
    return "sha256:" + h.hexdigest()


def model_dim(model_path: str | Path) -> int | None:
    """The vector size a local model produces, from its JSON files alone (no weights loaded): the
    projection size of a `dpr-train` run, else the question tower's hidden size; None if unknown."""
    from dpr.models.run_format import output_dim

    return output_dim(model_path)


def index_meta_path(index_path: str | Path) -> Path:
    return Path(str(index_path) + ".json")


def check_index_dim(where: str | Path, meta: dict, dim: int | None, model_path: str | Path) -> int | None:
    """The index's vectors against the model's ``dim`` (None: unknown, nothing checked): the same size, or a
    Matryoshka truncation the index records (``truncate_dim`` = its ``dim``, ``model_dim`` = the model's: the
    retriever cuts the questions alike). Returns the truncation size (None: none); any other size is one line
    naming ``where`` and both sizes (a DataError, field ``dim``)."""
    index_dim = meta.get("dim")
    if dim is None or not isinstance(index_dim, int) or index_dim == dim:
        return None
    truncated = meta.get("truncate_dim") == index_dim and meta.get("model_dim", dim) == dim
    if index_dim < dim and truncated:
        return index_dim
    why = ("a truncation of other vectors" if index_dim < dim and meta.get("truncate_dim") == index_dim
           else "not recorded as a truncation: encode.dim / dense.dims record it" if index_dim < dim
           else "built with another model")
    raise DataError(where, f"the model {model_path} makes {dim}-dim vectors but the index holds "
                    f"{index_dim}-dim ones ({why}): rebuild the index from this model's embeddings", field="dim")


def check_index_matches(index_path: str | Path, model_path: str | Path,
                        passages_path: str | Path | None = None) -> dict[str, Any]:
    """Refuse an index that another model or another passages file produced; returns its metadata.

    Cheap (hashes files, loads no model): call it before encoding any question. An index without
    fingerprints (built by another tool from shards that carry none, or before they existed) cannot
    be checked: that is logged as a warning, naming how to rebuild it with them.
    """
    index_path = Path(index_path)
    if not index_path.is_file():
        raise FileNotFoundError(f"index not found: {index_path}")
    meta_file = index_meta_path(index_path)
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        log.warning("%s missing: cannot check that %s was built by %s from %s (rebuild it with dpr-index)",
                    meta_file, index_path, model_path, passages_path)
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(meta_file, f"broken JSON ({err})") from None
    if not isinstance(meta, dict):
        raise DataError(meta_file, "expected a JSON object")
    check_index_dim(meta_file, meta, model_dim(model_path), model_path)
    want_model = meta.get("model_fingerprint")
    if not want_model:
        log.warning("%s: no model fingerprint, cannot check the index matches %s (re-encode with dpr-encode "
                    "and rebuild with dpr-index)", meta_file, model_path)
    got_model = model_fingerprint(model_path) if want_model else None
    if want_model and got_model != want_model:
        raise DataError(meta_file, f"index built by another model ({meta.get('model')}, {want_model[:19]}…) "
                        f"than {model_path} ({got_model[:19]}…); re-encode the passages with this model",
                        field="model_fingerprint")
    if passages_path is not None:
        want_p = meta.get("passages_sha256")
        got_p = passages_fingerprint(passages_path) if want_p else None
        if want_p and got_p != want_p:
            raise DataError(meta_file, f"index built from another passages file than {passages_path} "
                            f"({want_p[:19]}… != {got_p[:19]}…); re-encode it", field="passages_sha256")
    return meta
