"""BM25 hard negatives for DPR training (``hard_negative_ctxs``), as in the DPR paper.

For each training question, BM25's top passages (query = the question) become hard negatives unless
the false-negative filter (`dpr.negatives.filters`) rejects them as likely relevant: a positive of the
question, a passage whose text or title contains one of its answers (has_answer, string mode: a likely
false negative), or, for qrels data, a document judged for that query in any train/dev qrels. Passages
sharing no term with the question (score 0, which bm25s returns as padding) end the list: they are
random, not hard, negatives. Rejections are counted so the filter's effect is visible. The search and
the filter are `dpr.negatives.mine.mine_examples` over a `BM25Retriever`; this module adds the
training files, rewritten in place, and the ``bm25_mining.json`` marker.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping, Sequence

from dpr.atomic import sha256_file, write_json_atomic
from dpr.bm25.index import BM25Index
from dpr.negatives.bm25_config import BM25MiningConfig
from dpr.negatives.mine import judged_from_dataset, mine_examples
from dpr.retrieval.passages import PassageStore
from dpr.retrieval.retriever import BM25Retriever

if TYPE_CHECKING:
    import datasets

    from dpr.data.dataset import DatasetPaths

__all__ = ["MARKER_FILE", "judged_from_dataset", "mine_dataset", "mine_hard_negatives", "mining_up_to_date"]

log = logging.getLogger(__name__)

MARKER_FILE = "bm25_mining.json"
STATS = ("questions", "examined", "kept", "rejected_positive", "rejected_answer", "rejected_judged", "questions_short")


def mine_hard_negatives(
    index: BM25Index,
    examples: Sequence[dict],
    passages: "str | Path | datasets.Dataset",
    num_negatives: int = BM25MiningConfig.num_negatives,
    depth: int = BM25MiningConfig.depth,
    qrels: Mapping[str, Collection[str]] | None = None,
    n_threads: int = -1,
) -> tuple[list[dict], dict[str, int]]:
    """Return copies of ``examples`` with ``hard_negative_ctxs`` replaced by mined negatives, and counts.

    ``qrels`` maps a query id or a question text to the documents judged for it (any relevance);
    those are never negatives. Candidates are taken in BM25 order from the top ``depth``.
    """
    # the passages are loaded once (their ids must be the index's rows, checked here) and fetched per chunk
    retriever = BM25Retriever(index, passages, n_threads=n_threads)
    # end_at_score=0: bm25s pads with zero-score passages when fewer than `depth` share a term with the
    # question: those are random, not hard, negatives. check_title: a title naming the answer rejects too.
    mined, counts = mine_examples(retriever, examples, num_negatives=num_negatives, depth=depth, qrels=qrels,
                                  end_at_score=0.0, check_title=True)
    stats = {key: int(counts[key]) for key in STATS}
    log.info("mined %d hard negatives for %d questions; rejected %d positives, %d containing an answer "
             "(likely false negatives), %d judged in qrels; %d questions got fewer than %d",
             stats["kept"], stats["questions"], stats["rejected_positive"], stats["rejected_answer"],
             stats["rejected_judged"], stats["questions_short"], num_negatives)
    return mined, stats


def _marker_params(index: BM25Index, num_negatives: int, depth: int) -> dict[str, Any]:
    return {"index_key": index.meta.get("key"), "index_params": index.params,
            "passages": index.meta.get("passages"), "num_negatives": int(num_negatives), "depth": int(depth)}


def _split_files(ds: "DatasetPaths") -> dict[str, Path]:
    return {split: path for split, path in (("train", ds.train), ("dev", ds.dev)) if path.is_file()}


def mining_up_to_date(ds: "DatasetPaths", index: BM25Index, num_negatives: int = BM25MiningConfig.num_negatives,
                      depth: int = BM25MiningConfig.depth) -> bool:
    """True when the training files are those this miner last wrote, with the same index and settings."""
    marker = Path(ds.root) / MARKER_FILE
    if not marker.is_file():
        return False
    rec = json.loads(marker.read_text(encoding="utf-8"))
    if rec.get("params") != _marker_params(index, num_negatives, depth):
        return False
    files = _split_files(ds)
    return set(files) == set(rec.get("files", {})) and all(
        sha256_file(path) == rec["files"][split] for split, path in files.items())


def mine_dataset(
    index: BM25Index,
    ds: "DatasetPaths | str | Path",
    num_negatives: int = BM25MiningConfig.num_negatives,
    depth: int = BM25MiningConfig.depth,
    n_threads: int = -1,
    force: bool = False,
) -> dict[str, dict[str, int]]:
    """Mine hard negatives into a prepared dataset's ``train.json`` and ``dev.json`` (rewritten atomically)
    and record it in ``bm25_mining.json``; skipped when already up to date (unless ``force``)."""
    from dpr.data.dataset import DatasetPaths
    from dpr.data.retriever_json import read_retriever_json, write_retriever_json

    if not isinstance(ds, DatasetPaths):
        ds = DatasetPaths(ds)
    files = _split_files(ds)
    if not files:
        raise FileNotFoundError(f"no train.json or dev.json in {ds.root} to mine negatives for")
    if not force and mining_up_to_date(ds, index, num_negatives, depth):
        log.info("hard negatives in %s are up to date", ds.root)
        return json.loads((Path(ds.root) / MARKER_FILE).read_text(encoding="utf-8"))["stats"]
    qrels = judged_from_dataset(ds) if ds.has_qrels else None
    passages = PassageStore(ds.passages).ds
    all_stats: dict[str, dict[str, int]] = {}
    for split, path in files.items():
        examples = read_retriever_json(path)
        mined, stats = mine_hard_negatives(index, examples, passages, num_negatives=num_negatives, depth=depth,
                                           qrels=qrels, n_threads=n_threads)
        write_retriever_json(path, mined)
        all_stats[split] = stats
        log.info("%s: wrote %s", split, path)
    write_json_atomic(Path(ds.root) / MARKER_FILE, {
        "params": _marker_params(index, num_negatives, depth),
        "files": {split: sha256_file(path) for split, path in files.items()},
        "stats": all_stats,
    })
    return all_stats
