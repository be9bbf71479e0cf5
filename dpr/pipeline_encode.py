"""The pipeline's corpus encodes, shared by every process of a torchrun (or Slurm ``srun``) launch.

`encode_on_every_rank` splits the corpus into one shard per rank (`dpr.encode.encode_corpus` gives rank r the
shards ``i % world_size == r``), encodes this rank's shard, then waits until every rank's shard is finished, so
the index stage that follows sees the whole corpus in every process. One process: one shard, as before.

A complete, current set of shards already in the directory keeps its layout (its shard count): the trainer's
export (`dpr.encode.save_encoded`, one shard) is reused instead of being deleted and encoded again in
``world_size`` shards.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from dpr import encode
from dpr.encode_config import EncodeConfig
from dpr.index.shards import ShardFiles, check_shard

log = logging.getLogger(__name__)

_MANIFEST = re.compile(r"^shard_(\d{3,})_of_(\d{3,})\.json$")


def world() -> tuple[int, int]:
    """(rank, world size) by the rule that assigns encode shards to ranks (`dpr.encode.assigned_shards`)."""
    return encode._dist_env()


def current_layout(out: Path, model_path: str | Path, passages: Path) -> int | None:
    """The shard count of a complete set of finished shards in ``out`` that this model encoded from this passages
    file (content fingerprints; hashed once per file version, `dpr.index.hash_cache`), or None."""
    from dpr.index.fingerprint import model_fingerprint, passages_fingerprint

    counts = {int(m.group(2)) for p in out.glob("shard_*_of_*.json") if (m := _MANIFEST.match(p.name))}
    if len(counts) != 1:
        return None
    n = counts.pop()
    manifests = [check_shard(ShardFiles.of(out, i, n)) for i in range(n)]
    if any(m is None for m in manifests):
        return None
    want = {"model_fingerprint": model_fingerprint(model_path), "passages_sha256": passages_fingerprint(passages)}
    return n if all(m.get(k) == v for m in manifests for k, v in want.items()) else None


def wait_for_shards(out: Path, num_shards: int, poll_s: float = 2.0, timeout_s: float | None = None) -> None:
    """Return once every shard's manifest (written last, `dpr.index.shards.commit_shard`) exists in ``out``.
    A rank that fails ends the whole launch (torchrun stops every worker), so no wait outlives it; ``timeout_s``
    bounds it anyway where given (TimeoutError naming the missing shards)."""
    start, said = time.monotonic(), 0.0
    while True:
        missing = [i for i in range(num_shards) if not ShardFiles.of(out, i, num_shards).manifest.exists()]
        if not missing:
            return
        waited = time.monotonic() - start
        if timeout_s is not None and waited > timeout_s:
            raise TimeoutError(f"{out}: shard(s) {missing} of {num_shards} not finished after {waited:.0f} s")
        if waited - said >= 300 or said == 0.0:
            log.info("waiting for %d other rank(s)' shard(s) of %d in %s", len(missing), num_shards, out)
            said = max(waited, 1e-9)
        time.sleep(poll_s)


def encode_on_every_rank(model_path: str | Path, passages: Path, out: Path, config: EncodeConfig,
                         poll_s: float = 2.0) -> Path:
    """`dpr.encode.encode_corpus` in ``world_size`` shards (one per rank; a current complete set keeps its own
    count), then wait for the other ranks' shards. Returns ``out``."""
    from dpr.perf.malloc import release_freed_memory

    # training, earlier in this process, keeps its freed peak heap for its own steps (dpr/perf/malloc.py): the
    # encode and the stages after it do not need it
    release_freed_memory()
    rank, size = world()
    out = Path(out)
    num_shards = (current_layout(out, model_path, passages) if out.is_dir() else None) or size
    if size > 1:
        log.info("rank %d of %d: encoding its shard(s) of %d into %s", rank, size, num_shards, out)
    encode.encode_corpus(model_path, passages, out, config, num_shards=num_shards)
    wait_for_shards(out, num_shards, poll_s=poll_s)
    return out


def passage_count(passages: Path) -> int:
    """The corpus's size, from the memory-mapped Arrow copy every encode reads (built once, then reused)."""
    from dpr.data.passages import load_passages

    return len(load_passages(Path(passages)))
