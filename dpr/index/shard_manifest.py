"""What an embedding shard's manifest records about the encode that wrote it, and whether a finished shard may be
reused by a new encode (`dpr.encode.encode_corpus`, `save_encoded`): same model and passages (content fingerprints),
range, dtype, max length, quantize, runtime, weights, compile and ``encode.dim``. Keys recorded later default to what
older shards had; a finished shard of another ``weights`` / ``compile`` / ``dim`` setting refuses the resume."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from dpr.config import recorded_later
from dpr.encode_config import EncodeConfig
from dpr.errors import DataError
from dpr.index.fingerprint import model_fingerprint, passages_fingerprint
from dpr.index.shards import ShardFiles, check_shard

log = logging.getLogger(__name__)

_SHARD_FILE = re.compile(r"^shard_\d{3,}_of_(\d{3,})\.(npy|ids\.txt|json)$")


def passages_signature(passages_path: str | Path) -> dict[str, Any]:
    p = Path(passages_path).resolve()
    st = p.stat()
    return {"path": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def expected_manifest(files_count: int, start: int, end: int, shard_id: int, num_shards: int,
                      common: dict) -> dict:
    return {"shard_id": shard_id, "num_shards": num_shards, "start": start, "end": end,
            "count": files_count, **common}


def common_manifest(model_path: str | Path, passages_path: Path, total: int, dtype: str, max_length: int | None,
                    quantize: str, runtime: str, weights: str = "fp32", compile: bool = False,
                    truncate_dim: int | None = None) -> dict:
    """What every shard's manifest records about the run (what a finished shard must match to be reused).
    ``truncate_dim``: ``encode.dim`` (null: the model's full vectors), recorded only when set so that the manifests
    of full-size encodes stay as they were."""
    model_id = str(Path(model_path).resolve()) if Path(str(model_path)).is_dir() else str(model_path)
    return {"model": model_id, "model_fingerprint": model_fingerprint(model_path),
            "passages": passages_signature(passages_path), "passages_sha256": passages_fingerprint(passages_path),
            "total": total, "dtype": dtype, "max_length": max_length, "quantize": quantize, "runtime": runtime,
            "weights": weights, "compile": compile, **({"truncate_dim": truncate_dim} if truncate_dim else {})}


def is_finished(files: ShardFiles, expected: dict) -> bool:
    manifest = check_shard(files)
    if manifest is None:
        return False
    keys = ("shard_id", "num_shards", "start", "end", "total", "count", "dtype", "model_fingerprint",
            "passages_sha256", "max_length", "quantize", "runtime", "weights", "compile", "truncate_dim")
    # Shards written before the runtime / weights / compile were recorded: torch, fp32 weights, eager.
    return all(manifest.get(k, _RECORDED_LATER.get(k)) == expected.get(k, _RECORDED_LATER.get(k)) for k in keys)


# Manifest keys added after shards were first written, and the value older shards had: declared on EncodeConfig's
# fields (``recorded_before``; truncate_dim: written only when encode.dim truncates, absent = the full vectors).
_RECORDED_LATER = recorded_later(EncodeConfig)
# The setting's name where it differs from the manifest's key (encode.dim is recorded as truncate_dim).
_SETTING_NAMES = {f.metadata["recorded_as"]: f.name for f in dataclasses.fields(EncodeConfig)
                  if f.metadata.get("recorded_as")}


def _setting(value: Any) -> str:
    if value is None:
        return "null"  # dim=null: the full vectors
    return str(value).lower() if isinstance(value, bool) else str(value)  # compile=true, as typed on the CLI


def refuse_mixed(out: Path, num_shards: int, settings: dict[str, Any]) -> None:
    """A finished shard of this run's layout written with another ``weights`` / ``compile`` setting: refuse
    the resume (one index of bf16-weight and fp32-weight vectors, or of compiled and eager ones, would rank by
    two different computations)."""
    for i in range(num_shards):
        files = ShardFiles.of(out, i, num_shards)
        if not files.manifest.exists():
            continue
        manifest = check_shard(files)
        for key, value in settings.items():
            old = (manifest or {}).get(key, _RECORDED_LATER[key])
            name = _SETTING_NAMES.get(key, key)
            if manifest is not None and old != value:
                raise DataError(files.manifest, f"shard written with {name}={_setting(old)}, this run encodes with "
                                f"{name}={_setting(value)}: one index must not mix them; rerun with "
                                f"{name}={_setting(old)}, or use another output_dir (or delete these shards)",
                                field=key)


def remove_temps(files: ShardFiles) -> None:
    for tmp in files.directory.glob(f".{files.stem}.*.tmp"):
        tmp.unlink(missing_ok=True)


def remove_other_runs(out: Path, num_shards: int) -> None:
    """Delete shards of an earlier run with a different ``num_shards``: mixed with this run's they would
    hold some passages twice (`dpr.index.shards.list_shards` refuses such a directory)."""
    stale = [p for p in out.glob("shard_*_of_*.*")
             if (m := _SHARD_FILE.match(p.name)) and int(m.group(1)) != num_shards]
    if stale:
        log.warning("%s: removing %d file(s) of an earlier run with another num_shards", out, len(stale))
        for p in stale:
            p.unlink(missing_ok=True)
