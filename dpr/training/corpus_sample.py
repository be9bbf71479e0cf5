"""A stated number of passages for the frozen-index phase and corpus negatives (``train.corpus_sample``).

Scoring every question against the whole corpus costs memory and time in proportion to it in every rank (texts,
token ids, vectors, the answer search): at 21M passages that does not fit. With ``corpus_sample=n`` the cached corpus
is a sub-corpus of ``n`` passages instead: every passage the training file names (its questions' positives, which
are the frozen steps' targets, and their mined negatives) that the passages file holds, plus passages drawn from the
rest, the same ones for the same seed whatever the file's order or size. The draw is a bottom-k sample: each passage
gets a key hashed from (seed, id) and the ``n`` smallest keys are kept, one pass over the file holding at most ``n``
passages, so memory is set by ``n``, not by the corpus.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
from pathlib import Path
from typing import Collection, NamedTuple

from tqdm import tqdm

log = logging.getLogger(__name__)


# Above this many passages a run without train.corpus_sample samples this many: the whole corpus would hold its texts,
# token ids, vectors and a FAISS copy in every rank (~240 GB at 21M 768-d passages)
WHOLE_CORPUS_MAX = 500_000


def auto_sample_size(passages: str | Path, limit: int = WHOLE_CORPUS_MAX) -> int | None:
    """``train.corpus_sample=null``: None (the whole corpus) up to ``limit`` passages, else ``limit`` (logged)."""
    from dpr.data.passages import count_passages

    n = count_passages(passages)
    if n <= limit:
        return None
    log.warning("%s: %d passages > %d: the frozen-index phase / corpus negatives use a seeded sample of %d "
                "(train.corpus_sample sets its size)", passages, n, limit, limit)
    return limit


class CorpusSample(NamedTuple):
    """The sampled passages in file order: ids, texts, titles, and each one's row in the passages file."""

    ids: list[str]
    texts: list[str]
    titles: list[str]
    positions: list[int]


def sample_key(seed: int, passage_id: str) -> int:
    """A passage's place in the seeded draw (smaller: drawn first)."""
    h = hashlib.blake2b(f"{int(seed)}\x1f{passage_id}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def sample_corpus(passages: str | Path, size: int, seed: int, keep: Collection[str]) -> CorpusSample:
    """``size`` passages of ``passages`` (more where the passages in ``keep`` alone are more): every passage whose id
    is in ``keep``, the rest drawn by :func:`sample_key`. One streamed pass; at most ``size`` passages held."""
    from dpr.data.passages import iter_passages

    kept: list[tuple[int, str, str, str]] = []  # (row, id, text, title) of the passages in keep
    heap: list[tuple[int, int, str, str, str]] = []  # max-heap by key: (-key, row, id, text, title) of the drawn
    room = size
    total = 0
    for row, p in enumerate(tqdm(iter_passages(passages), desc="corpus sample", unit="psg", mininterval=5)):
        total += 1
        pid = p["id"]
        if pid in keep:
            kept.append((row, pid, p["text"], p.get("title") or ""))
            continue
        key = sample_key(seed, pid)
        if len(heap) < room:
            heapq.heappush(heap, (-key, row, pid, p["text"], p.get("title") or ""))
        elif -heap[0][0] > key:
            heapq.heapreplace(heap, (-key, row, pid, p["text"], p.get("title") or ""))
    # the drawn passages make up what keep leaves of size: the smallest keys first
    drawn = sorted(heap, key=lambda h: -h[0])[:max(0, size - len(kept))]
    rows = sorted([(r, i, t, ti) for r, i, t, ti in kept] + [(r, i, t, ti) for _, r, i, t, ti in drawn])
    log.info("corpus sample: %d of %d passages (%d named by the training file, %d drawn with seed %d)", len(rows),
             total, len(kept), len(drawn), seed)
    if len(kept) > size:
        log.warning("train.corpus_sample=%d is smaller than the %d passages the training file names: the sample holds "
                    "those %d", size, len(kept), len(kept))
    return CorpusSample([r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], [r[0] for r in rows])
