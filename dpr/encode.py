"""Sharded, resumable passage encoding: ``passages.tsv`` → embedding shards (`dpr.index.shards` format).

Shard ``i`` of ``n`` is a contiguous passage range (``shard_range``). Passages are read from the Arrow copy of
the TSV (`load_passages`) a chunk at a time with ``read()``, not through its memory map (`dpr.data.passage_chunks`),
and each chunk's vectors are written at their rows of a temp ``.npy`` with ``pwrite`` (`dpr.index.shard_alloc`), so
the process holds one chunk of text and vectors and one batch of activations however big the corpus: no page of
either file stays resident in it. Within a chunk, batches are length-sorted and padded only to their longest passage
(`dpr.models.iter_encode_batches`), under inference mode with bf16 autocast where the hardware has it.

Runtime: ``runtime=auto`` (default: ``onnx`` where the encode runs in fp32 on an AVX-512 CPU, else torch), ``torch``
or ``onnx`` (`dpr.models.onnx_runtime`: the passage tower exported once, cached by the model's fingerprint, run by
ONNX Runtime on the CPU in fp32). Weights: ``weights=auto`` (default, = fp32: fp32 weights under ``autocast``),
``fp32`` or ``bf16`` (`dpr.models.weights`: cast to bf16 once, no autocast). ``compile=true`` (`dpr.models.compile`,
default false): the passage tower run through ``torch.compile(dynamic=True)``.

Resuming (`dpr.index.shard_manifest`): a shard whose manifest exists and matches (content fingerprints of the model
and the passages file, `dpr.index.fingerprint`; dtype, max length, range, quantize, runtime, weights, compile) is
skipped. Finished shards written with another ``weights`` or ``compile`` setting are refused (one error naming
the manifest and the field): bf16-weight and fp32-weight vectors differ by more than float rounding, compiled
and eager ones by rounding, and one index must not mix either. Anything else is redone from scratch:
files are written under temp names (``.shard_*.tmp``) and renamed at the end, manifest last, so a killed
run leaves nothing that looks finished and never duplicates a passage.

Under torchrun each rank encodes shards ``i % world_size == rank`` (no process group needed).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
from tqdm.auto import tqdm

from dpr.checks import INT32_MAX, MAX_BATCH, MAX_SHARDS, check_int, check_max_length, check_optional_int
from dpr.encode_config import EncodeConfig
from dpr.index.shard_manifest import (common_manifest, expected_manifest, is_finished, refuse_mixed, remove_other_runs,
                                      remove_temps)
from dpr.index.shard_alloc import VectorWriter, reserve_space  # noqa: F401 - reserve_space: dpr.encode's API
from dpr.index.shards import ShardFiles, commit_shard, shard_range, shards_for_rank

log = logging.getLogger(__name__)

DTYPES = ("float16", "float32")


def _dist_env() -> tuple[int, int]:
    """(rank, world_size) from torchrun's environment; (0, 1) when not launched by it."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def assigned_shards(num_shards: int, shard_id: int | None = None,
                    rank: int | None = None, world_size: int | None = None) -> list[int]:
    """Which shards this process encodes.

    ``shard_id`` given: that shard only (by rank 0 under torchrun). Otherwise every shard in one
    process, or under torchrun the shards ``i % world_size == rank``.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    env_rank, env_world = _dist_env()
    rank = env_rank if rank is None else rank
    world_size = env_world if world_size is None else world_size
    if shard_id is not None:
        if not 0 <= int(shard_id) < num_shards:
            raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        # one explicit shard under torchrun: rank 0 encodes it; others would write the same files
        return [int(shard_id)] if rank == 0 else []
    return shards_for_rank(num_shards, rank, world_size)


def _non_finite_message(dtype: str, vecs: Any, shard: int, a: int, b: int, model_path: str | Path) -> str:
    """Why passage vectors are not finite: the storage type overflowed (the model's own float32 vectors were
    finite), or the model itself produced NaN/inf (corrupt or diverged weights: another dtype cannot help)."""
    if dtype != "float32" and np.isfinite(vecs.float().numpy()).all():
        return f"passage vectors overflow {dtype} in shard {shard} (rows {a}-{b}); use dtype=float32"
    return (f"the model {model_path} produces non-finite (NaN/inf) passage vectors in shard {shard} (rows {a}-{b}): "
            "its weights are corrupt or diverged; check the model (another dtype= cannot fix this)")


def encode_corpus(
    model_path: str | Path,
    passages_path: str | Path,
    output_dir: str | Path,
    config: EncodeConfig | None = None,
    *,
    shard_id: int | None = None,
    num_shards: int = 1,
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> Path:
    """Encode the passages with the passage tower into ``output_dir`` with the settings ``config`` (an
    `EncodeConfig`, its defaults when None: dpr-encode's root keys, dpr-pipeline's ``encode`` section); returns
    ``output_dir``.

    ``shard_id=None`` encodes every shard assigned to this process (all of them outside torchrun);
    ``cache_dir`` also holds the Arrow copy of the passages (default: datasets' cache). The settings:
    ``dtype`` is the storage type of the vectors (float16 halves disk and index-build I/O);
    ``max_length`` defaults to the model's ``passage_max_length``; ``autocast`` "auto" | "bf16" |
    "fp16" | "off"; ``quantize`` "auto" | "none" | "int8" (`dpr.models.quantize`: int8 replaces autocast,
    and ``auto`` is none, int8 failing the quality bar); ``runtime`` "auto" | "torch" | "onnx"
    (`dpr.models.onnx_runtime`: CPU, fp32, autocast does not apply; auto = onnx where the encode runs in fp32 on an
    AVX-512 CPU; the graph is cached under
    ``<cache_dir>/onnx``, default the data cache's); ``device`` defaults to cuda:LOCAL_RANK when CUDA is
    available and the runtime is torch, else CPU; ``weights`` "auto" (= fp32) | "fp32" | "bf16" (`dpr.models.weights`: bf16
    weights replace autocast; recorded in the manifests, and a resume with another setting is refused);
    ``compile`` (`dpr.models.compile`: the passage tower through ``torch.compile(dynamic=True)``; a torch
    lever, so ``runtime=auto`` is torch with it; recorded and refused on a mixed resume as ``weights``);
    ``length_sort`` "tokens" | "chars" | "none" (`dpr.models.iter_encode_batches`: how each chunk is batched; the
    same vectors up to rounding, so not recorded, like ``batch_size``); ``dim`` (Matryoshka, `dpr.models.truncate`):
    each vector's first ``dim`` coordinates, re-normalised for a cosine model (null or the model's size: the full
    vectors; larger: one line before any work; recorded as ``truncate_dim``, a resume with another is refused).
    """
    from dpr.data.passage_chunks import passage_source
    from dpr.data.passages import load_passages

    settings = _resolve_settings(EncodeConfig() if config is None else config, model_path, num_shards, shard_id)
    todo_ids = assigned_shards(int(num_shards), shard_id)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_other_runs(out, int(num_shards))
    refuse_mixed(out, int(num_shards), {"weights": settings.weights, "compile": settings.compile,
                                        "truncate_dim": settings.truncate_dim})
    passages_path = Path(passages_path)
    # the Arrow file's name and row count; the memory-mapped dataset itself is let go (its pages would stay resident)
    source = passage_source(load_passages(passages_path, cache_dir=cache_dir))
    cfg = settings.cfg
    common = common_manifest(model_path, passages_path, source.rows, cfg.dtype, cfg.max_length, settings.quantize,
                             settings.runtime, settings.weights, settings.compile, settings.truncate_dim)
    pending = _pending_shards(out, todo_ids, source.rows, num_shards, common)
    if not pending:
        log.info("all %d assigned shard(s) already encoded in %s", len(todo_ids), out)
        return out
    encoder = _load_encoder(model_path, settings, common["model_fingerprint"], cache_dir)
    for shard in pending:
        _encode_shard(source, encoder, shard, num_shards, progress)
    return out


@dataclass(frozen=True)
class _Settings:
    """An `EncodeConfig` checked, with its "auto" levers resolved for this machine (what the manifests record)."""

    cfg: EncodeConfig  # as given: batch_size, dtype, max_length, chunk_size, length_sort, autocast
    device: str | None  # checked; None: the one device rule
    quantize: str
    weights: str
    compile: bool
    runtime: str
    truncate_dim: int | None  # Matryoshka size, None: the model's full vectors


def _resolve_settings(cfg: EncodeConfig, model_path: str | Path, num_shards: int, shard_id: int | None) -> _Settings:
    """Every setting checked, in this order, before any work (one-line ValueError/TypeError), and the levers'
    "auto" resolved: quantize, weights, compile, then the runtime they leave."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {cfg.dtype!r}")
    check_int("batch_size", cfg.batch_size, 1, MAX_BATCH)
    check_int("chunk_size", cfg.chunk_size, 1, INT32_MAX)
    check_int("num_shards", num_shards, 1, MAX_SHARDS)
    check_optional_int("shard_id", shard_id, 0, int(num_shards) - 1, f" (num_shards={num_shards})")
    check_max_length(cfg.max_length)  # the model's own bound once it is loaded, before anything is encoded
    from dpr.distributed import check_device
    from dpr.index.fingerprint import model_dim
    from dpr.models.compile import resolve_compile
    from dpr.models.inference import check_length_sort
    from dpr.models.onnx_runtime import require_onnxruntime, resolve_runtime
    from dpr.models.quantize import resolve_quantize
    from dpr.models.truncate import check_dim
    from dpr.models.weights import resolve_weights

    # the model's size from its JSON files (a hub name: checked again once loaded, still before any encoding)
    truncate_dim = check_dim(cfg.dim, model_dim(model_path), f"the model {model_path}")
    check_length_sort(cfg.length_sort)
    device = check_device(cfg.device)  # the one device rule's key, checked once: auto/null is the rule (None)
    quantize = resolve_quantize(cfg.quantize)  # validated before any work; the device is checked once known
    weights = resolve_weights(cfg.weights, device, cfg.autocast, quantize, str(cfg.runtime or "torch").lower())
    compile = resolve_compile(cfg.compile, cfg.runtime, quantize)
    runtime = cfg.runtime
    if compile and str(runtime or "auto").lower() == "auto":
        runtime = "torch"  # the compile lever is torch's: auto must not pick ONNX Runtime under it
    # auto: onnx for fp32 on an AVX-512 CPU (bf16 weights are no fp32 encode)
    runtime = resolve_runtime(runtime, device, cfg.autocast if weights == "fp32" else "bf16", quantize)
    if runtime == "onnx":
        require_onnxruntime()  # an explicit onnx on an install without it: one line, before any work
    return _Settings(cfg, device, quantize, weights, compile, runtime, truncate_dim)


class _Shard(NamedTuple):
    """One shard to encode: its number, passage rows ``[start, end)``, files and the manifest it will match."""

    i: int
    start: int
    end: int
    files: ShardFiles
    expected: dict


def _pending_shards(out: Path, todo_ids: list[int], total: int, num_shards: int, common: dict) -> list[_Shard]:
    """The assigned shards not yet finished with this manifest (`is_finished`); the finished ones are logged."""
    pending = []
    for i in todo_ids:
        start, end = shard_range(total, i, num_shards)
        files = ShardFiles.of(out, i, num_shards)
        expected = expected_manifest(end - start, start, end, i, num_shards, common)
        if is_finished(files, expected):
            log.info("shard %d/%d already encoded (%s): skipped", i, num_shards, files.manifest.name)
            continue
        pending.append(_Shard(i, start, end, files, expected))
    return pending


@dataclass(frozen=True)
class _Encoder:
    """The loaded passage tower and what each shard's vectors are made with."""

    model: Any
    tokenizer: Any
    options: Any  # dpr.models.EncodeOptions of every chunk
    model_path: str | Path
    dtype: str  # storage type of the vectors
    chunk_size: int
    truncate_dim: int | None
    dim: int  # stored vector size
    normalized: bool  # cosine model: unit vectors
    sizes: dict  # {"model_dim": full size} beside a truncated one, else empty


def _load_encoder(model_path: str | Path, s: _Settings, fingerprint: str, cache_dir: str | Path | None) -> _Encoder:
    """The passage tower on its device with the resolved levers (quantize, weights, compile, ONNX runner), its
    sizes checked against ``max_length`` and ``dim``."""
    import torch

    from dpr.distributed import device as default_device
    from dpr.models import EncodeOptions, load_biencoder
    from dpr.models.compile import compile_tower, require_compile
    from dpr.models.quantize import quantize_for_inference
    from dpr.models.truncate import check_dim
    from dpr.models.weights import cast_weights, inference_autocast

    cfg = s.cfg
    dev = torch.device(s.device) if s.device else torch.device("cpu") if s.runtime == "onnx" else default_device()
    if s.compile:
        require_compile(dev)  # no C++ compiler for inductor: one line now, not a traceback in the first batch
    model, tokenizer = load_biencoder(str(model_path))
    check_max_length(cfg.max_length, model.passage_encoder)
    model.to(dev)
    model = cast_weights(quantize_for_inference(model, s.quantize, dev), s.weights)
    if s.compile:
        compile_tower(model, "passage")  # compiles lazily: the first batch pays it (and each new dtype)
    autocast = inference_autocast(s.weights, cfg.autocast)
    if s.quantize == "int8":
        autocast = "off"  # int8 kernels take fp32 activations
    runner = None
    if s.runtime == "onnx":
        from dpr.models.onnx_runtime import onnx_tower

        runner = onnx_tower(model, tokenizer, "passage", fingerprint,
                            cache_dir=Path(cache_dir) / "onnx" if cache_dir is not None else None)
    model_size = int(model.dim)
    check_dim(s.truncate_dim, model_size, f"the model {model_path}")  # a hub name's size is known only now
    options = EncodeOptions(batch_size=cfg.batch_size, max_length=cfg.max_length, device=dev, autocast=autocast,
                            runner=runner, length_sort=cfg.length_sort)
    return _Encoder(model, tokenizer, options, model_path, cfg.dtype, cfg.chunk_size, s.truncate_dim,
                    min(s.truncate_dim or model_size, model_size), model.config.similarity == "cosine",
                    {"model_dim": model_size} if s.truncate_dim else {})  # the full size, beside a truncated one


def _encode_shard(source: Any, enc: _Encoder, shard: _Shard, num_shards: int, progress: bool) -> None:
    """Encode one shard's passages (rows of ``source``, a `dpr.data.passage_chunks.PassageSource`) into temp files,
    renamed into place with the manifest last (`commit_shard`)."""
    from dpr.data.passage_chunks import iter_chunks

    i, start, end, files = shard.i, shard.start, shard.end, shard.files
    remove_temps(files)  # leftovers of a killed run: never reused, never mistaken for output
    files.manifest.unlink(missing_ok=True)  # an outdated shard stops counting as finished right away
    tmp_vectors = files.directory / f".{files.stem}.npy.tmp"
    tmp_ids = files.directory / f".{files.stem}.ids.txt.tmp"
    count = end - start
    t0 = time.perf_counter()
    with VectorWriter(tmp_vectors, count, enc.dim, np.dtype(enc.dtype), i) as vectors, \
            open(tmp_ids, "w", encoding="utf-8") as ids_f, \
            tqdm(total=count, desc=f"encode shard {i}/{num_shards}", unit="psg", disable=not progress) as bar:
        for a, rows in iter_chunks(source, start, end, enc.chunk_size):
            b = a + len(rows["id"])
            for pid in rows["id"]:
                ids_f.write(pid + "\n")
            chunk = np.zeros((b - a, enc.dim), dtype=np.dtype(enc.dtype))  # the chunk's rows, written at once
            for pos, arr in _encode_chunk(enc, rows, i, a, b):
                chunk[np.asarray(pos)] = arr
                bar.update(len(pos))
            vectors.write(a - start, chunk)
    seconds = time.perf_counter() - t0
    manifest = {**shard.expected, "dim": enc.dim, **enc.sizes, "normalized": enc.normalized,
                "seconds": round(seconds, 2),
                "passages_per_second": round(count / seconds, 1) if seconds > 0 else None}
    commit_shard(files, tmp_vectors, tmp_ids, manifest)
    log.info("shard %d/%d: %d passages × %d dims (%s) in %.1f s → %s", i, num_shards, count, enc.dim, enc.dtype,
             seconds, files.vectors)


def _encode_chunk(enc: _Encoder, rows: dict, shard: int, a: int, b: int) -> Iterator[tuple[Any, np.ndarray]]:
    """(positions within the chunk, stored vectors) per batch of the chunk's rows ``[a, b)``; a non-finite vector
    is a ValueError naming the shard and rows."""
    from dpr.models import iter_encode_batches
    from dpr.models.truncate import truncate

    for pos, vecs in iter_encode_batches(enc.model, enc.tokenizer, rows["text"], "passage", enc.options,
                                         titles=rows["title"]):
        arr = truncate(vecs, enc.truncate_dim, enc.normalized).numpy().astype(np.dtype(enc.dtype))
        if not np.isfinite(arr).all():
            raise ValueError(_non_finite_message(enc.dtype, vecs, shard, a, b, enc.model_path))
        yield pos, arr


# The name used in ARCHITECTURE.md's contract list.
encode_passages = encode_corpus


def save_encoded(model_path: str | Path, passages_path: str | Path, output_dir: str | Path, ids: list[str],
                 vectors: np.ndarray, config: EncodeConfig | None = None, *, computed_with: dict, num_shards: int = 1,
                 cache_dir: str | Path | None = None) -> bool:
    """Store corpus vectors computed elsewhere (the trainer's validation of the weights it saved) as the
    finished shard that ``encode_corpus`` with the same arguments (``config``: its `EncodeConfig`) would write, so
    that call then skips
    the encoding (~2 minutes per 3,500 passages on 2 CPU cores). Returns whether it wrote.

    Only vectors that are what ``encode_corpus`` would compute are stored: one shard, the torch runtime
    without quantization from fp32 weights, eager (no ``compile``), the same device type, autocast dtype and max length (``computed_with``:
    ``device``, ``autocast``, ``max_length`` of the vectors), every passage's id in file order. Anything
    else returns False and ``encode_corpus`` encodes as usual (batch order may differ: the same model and
    precision up to float rounding).
    """
    import torch

    from dpr.data.passages import load_passages
    from dpr.distributed import device as default_device
    from dpr.index.shards import write_shard
    from dpr.models import read_biencoder_config
    from dpr.models.compile import resolve_compile
    from dpr.models.onnx_runtime import resolve_runtime
    from dpr.models.quantize import resolve_quantize
    from dpr.models.weights import resolve_weights
    from dpr.trainkit.precision import autocast_dtype

    cfg = EncodeConfig() if config is None else config
    dtype, autocast, quantize, runtime, device = cfg.dtype, cfg.autocast, cfg.quantize, cfg.runtime, cfg.device
    max_length, weights, compile = cfg.max_length, cfg.weights, cfg.compile  # quantize..compile: resolved below
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    check_max_length(max_length)
    quantize = resolve_quantize(quantize)
    from dpr.distributed import check_device

    device = check_device(device)  # the one device rule's key: auto/null is the rule (None)
    weights = resolve_weights(weights, device, autocast, quantize, str(runtime or "torch").lower())
    compile = resolve_compile(compile, runtime, quantize)
    runtime = "torch" if compile and str(runtime or "auto").lower() == "auto" else \
        resolve_runtime(runtime, device, autocast if weights == "fp32" else "bf16", quantize)
    dev = device or str(default_device())
    saved = read_biencoder_config(model_path)
    want_length = max_length if max_length is not None else saved.passage_max_length
    why = None
    if num_shards != 1 or runtime != "torch" or quantize != "none" or weights != "fp32" or compile:
        why = f"num_shards={num_shards}, runtime={runtime}, quantize={quantize}, weights={weights}, compile={compile}"
    elif torch.device(dev).type != torch.device(computed_with["device"]).type or \
            autocast_dtype(dev, autocast) != autocast_dtype(computed_with["device"], computed_with["autocast"]):
        why = f"encode on {dev} with autocast {autocast}, vectors from {computed_with['device']} with " \
              f"{computed_with['autocast']}"
    elif want_length != computed_with["max_length"]:
        why = f"max_length {want_length} != {computed_with['max_length']}"
    else:
        file_ids = list(load_passages(Path(passages_path), cache_dir=cache_dir)["id"])
        if file_ids != list(ids):
            why = f"{len(ids)} ids that are not {passages_path}'s {len(file_ids)} in file order"
    if why is not None:
        log.info("corpus vectors not reused for %s (%s): it will be encoded", output_dir, why)
        return False
    from dpr.models.truncate import check_dim, truncate

    normalized = saved.similarity == "cosine"
    full = np.asarray(vectors, dtype=np.float32)
    truncate_dim = check_dim(cfg.dim, full.shape[1], f"the model {model_path}")  # encode.dim: as encode_corpus cuts
    arr = truncate(torch.from_numpy(full), truncate_dim, normalized).numpy().astype(dtype)
    if not np.isfinite(arr).all():
        return False  # encode_corpus reports the overflow with its row numbers
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_other_runs(out, 1)
    common = common_manifest(model_path, Path(passages_path), len(ids), dtype, max_length, quantize, runtime, weights,
                             compile, truncate_dim)
    sizes = {"model_dim": full.shape[1]} if truncate_dim else {}
    # the manifest encode_corpus writes (expected_manifest: shard 0 of 1, rows 0..N), plus where it came from
    write_shard(out, 0, 1, arr, list(ids), start=0, end=len(ids), **common, **sizes, normalized=normalized,
                seconds=0.0, reused_from="training validation")
    log.info("stored %d corpus vectors from training as %s (no re-encoding)", len(ids), out)
    return True
