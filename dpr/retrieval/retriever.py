"""`Retriever`: BM25, dense and hybrid search behind one interface, ``search(questions, k)``.

    from dpr import Retriever
    bm25 = Retriever.bm25("data/prepared/squad1_open/passages.tsv")
    dense = Retriever.dense("runs/squad1_open/model", "runs/squad1_open/dense/index.faiss",
                            passages="data/prepared/squad1_open/passages.tsv")
    hits = Retriever.hybrid(bm25, dense, weight=0.5).search(["who wrote hamlet?"], k=5)[0]

Every retriever implements ``search_ids`` (ranked ``(passage id, score)`` per question); ``search``
adds titles and texts from the passages file. Both take a list of question strings, or one string as one
question (the result is still one ranked list per question: ``search("q")[0]``). Every argument is
checked first: a wrong type is a TypeError, a value out of range (``k=0``, ``weight=nan``) a
ValueError, each one line naming the argument and what it got (`dpr.checks`). The CLI commands, the
pipeline's retrieval stages and the fusion of result files all go through these classes and `dpr.retrieval.fusion.fuse_ranked`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.passages import PassageStore
from dpr.checks import (INT32_MAX, MAX_BATCH, MAX_K, MAX_THREADS, check_int, check_max_length, check_optional_int,
                        check_questions)
from dpr.config import with_overrides
from dpr.errors import DataError

if TYPE_CHECKING:
    import datasets

    from dpr.bm25.index import BM25Index

log = logging.getLogger(__name__)

Ranked = list[tuple[str, float]]


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its id, score (higher = better), title and text."""

    id: str
    score: float
    title: str | None = None
    text: str | None = None


class Retriever:
    """The common interface; build one with `Retriever.bm25`, `Retriever.dense` or `Retriever.hybrid`."""

    name = "retriever"
    store: PassageStore | None = None

    # ---------------------------------------------------------------------------------- factories
    @staticmethod
    def bm25(passages: "str | Path | datasets.Dataset", index_dir: str | Path | None = None, *,
             index: "BM25Index | None" = None, k1: float | None = None, b: float | None = None,
             stopwords: str | None = None, stemmer: str | None = None, n_threads: int = -1) -> "BM25Retriever":
        """BM25 over ``passages`` (a passages.tsv). The index is ``index`` when given, else loaded from
        ``index_dir`` when it is up to date there (built and saved when not), else built in memory.
        BM25 settings default to the project's (k1=0.9, b=0.4, English stopwords and stemming)."""
        from dpr import bm25 as bm25_pkg
        from dpr.bm25.index import check_bm25_params

        check_bm25_params(k1, b)
        check_int("n_threads", n_threads, -1, MAX_THREADS, " (0 = the calling thread, -1 = all cores)")
        params = {key: v for key, v in {"k1": k1, "b": b, "stopwords": stopwords, "stemmer": stemmer}.items()
                  if v is not None}
        if index is None:
            if not isinstance(passages, (str, Path)):
                raise ValueError("building a BM25 index needs the passages file path")
            index = (bm25_pkg.get_or_build_index(passages, index_dir, **params) if index_dir is not None
                     else bm25_pkg.build_index(passages, **params))
        elif params:
            raise ValueError("BM25 settings come with a prebuilt index; do not pass them as well")
        return BM25Retriever(index, passages, n_threads=n_threads)

    @staticmethod
    def dense(run_dir: str | Path, index: str | Path, passages: "str | Path | datasets.Dataset | None" = None,
              **options: Any) -> "DenseRetriever":
        """Dense search with a run directory's question tower (or any HF model) over a FAISS index from
        ``dpr-index``; ``passages`` is the passages.tsv the index was encoded from (needed by ``search``,
        not by ``search_ids``). ``options``: see `DenseRetriever` (its settings one by one, or ``config=`` a
        whole `RetrieveConfig`)."""
        return DenseRetriever(run_dir, index, passages, **options)

    @staticmethod
    def hybrid(bm25: "Retriever", dense: "Retriever", weight: float | None = None, *, fusion: str = "linear",
               normalize: str = "minmax", k_rrf: float = 60, depth: int = 100) -> "HybridRetriever":
        """Fuse two retrievers per question: ``dense + weight · bm25`` (weight finite in [0, 1e6]) after
        per-question min-max normalisation (``fusion="linear"``; the pipeline writes its dev-tuned weight to
        ``<run>/hybrid/weight.json``), or reciprocal rank fusion (``fusion="rrf"``), over each one's
        top ``depth``."""
        return HybridRetriever(bm25, dense, weight, fusion=fusion, normalize=normalize, k_rrf=k_rrf, depth=depth)

    # -------------------------------------------------------------------------------- the interface
    def search_ids(self, questions: Sequence[str] | str, k: int = 10) -> list[Ranked]:
        """The top ``k`` ``(passage id, score)`` per question, best first (a single string is one question)."""
        return self._search_ids(check_questions(questions), _check_k(k))

    def _search_ids(self, questions: list[str], k: int) -> list[Ranked]:
        """`search_ids` with checked arguments: what each retriever implements."""
        raise NotImplementedError

    def passage_ids(self) -> Sequence[str] | None:
        """The ids of the passages it searches (its index's), or None where unknown."""
        return None

    def search(self, questions: Sequence[str] | str, k: int = 10) -> list[list[Hit]]:
        """The top ``k`` passages per question (a single string is one question), best first, with
        titles and texts."""
        questions, k = check_questions(questions), _check_k(k)
        if self.store is None:
            raise ValueError(f"{self.name} retriever has no passages file: give passages= to fetch texts, "
                             "or call search_ids")
        ranked = self._search_ids(questions, k)
        psg = self.store.fetch([pid for row in ranked for pid, _ in row])
        return [[Hit(pid, score, psg[pid]["title"], psg[pid]["text"]) for pid, score in row] for row in ranked]


def _check_model_exists(model: str | Path) -> None:
    """A model given as a path must exist (FileNotFoundError, one line); a hub name (``name``, ``org/name``) is left
    to the loader. The rule of the commands' model keys (`dpr.cli.common.check_model_path`)."""
    import os

    from dpr.models.hub import resolve_model_name

    value = str(model)
    if Path(os.path.expanduser(resolve_model_name(value))).exists():
        return
    if value.startswith((".", "/", "~")) or value.count("/") > 1 or (os.sep != "/" and os.sep in value):
        raise FileNotFoundError(f"model not found: {value} (no such directory)")


def _check_k(k: int, name: str = "k") -> int:
    return check_int(name, k, 1, MAX_K)


# The RetrieveConfig fields that `DenseRetriever` reads (the others: k, match, fusion, weight, are the callers').
DENSE_OPTIONS = ("batch_size", "search_batch_size", "device", "autocast", "weights", "index_device", "nprobe",
                 "ef_search", "max_length")


def dense_config(config: RetrieveConfig | None, options: dict[str, Any]) -> RetrieveConfig:
    """``config`` (the defaults when None) with the keyword ``options`` replaced: each one of `DENSE_OPTIONS`
    (`dpr.config.with_overrides`: a TypeError naming any other and the options)."""
    return with_overrides(config or RetrieveConfig(), options, "DenseRetriever()", known=DENSE_OPTIONS)


class BM25Retriever(Retriever):
    """BM25 (bm25s weights, `dpr.bm25`) over an index built from the same passages file."""

    name = "bm25"

    def __init__(self, index: "BM25Index", passages: "str | Path | datasets.Dataset | None" = None,
                 n_threads: int = -1) -> None:
        self.index = index
        self.n_threads = check_int("n_threads", n_threads, -1, MAX_THREADS, " (0 = the calling thread, -1 = all cores)")
        self.store = PassageStore(passages) if passages is not None else None
        if self.store is not None:
            self.store.check_order(index.ids)

    def _search_ids(self, questions: list[str], k: int) -> list[Ranked]:
        from dpr.bm25.search import search_indices

        if not questions:
            return []
        rows, scores = search_indices(self.index, questions, k, n_threads=self.n_threads)
        ids = self.index.ids
        return [[(ids[r], float(s)) for r, s in zip(rr, ss)] for rr, ss in zip(rows.tolist(), scores.tolist())]

    def passage_ids(self) -> Sequence[str] | None:
        return self.index.ids


class DenseRetriever(Retriever):
    """Question tower → FAISS top k, with the settings ``config`` (a `RetrieveConfig`, its defaults when None: the
    keys of ``dpr-retrieve``; its fields that concern the dense search may also be given as keywords, which override
    it): ``batch_size`` (question encoding), ``search_batch_size``,
    ``device`` (encoder; default cuda:LOCAL_RANK if available, else cpu), ``autocast`` ("auto", "bf16",
    "fp16", "off"), ``weights`` ("auto" = "fp32", "bf16": the question encoder cast to bf16 once instead of
    autocast, `dpr.models.weights`), ``index_device`` ("cpu" | "gpu"), ``nprobe`` / ``ef_search`` (IVF / HNSW search
    breadth), ``max_length`` (question tokens; default the model's); ``cache_dir`` (Arrow cache)."""

    name = "dense"

    def __init__(self, run_dir: str | Path, index: str | Path,
                 passages: "str | Path | datasets.Dataset | None" = None, *, config: RetrieveConfig | None = None,
                 cache_dir: str | Path | None = None, **options: Any) -> None:
        from dpr.index import load_index
        from dpr.index.fingerprint import check_index_matches

        cfg = dense_config(config, options)
        self.batch_size = check_int("batch_size", cfg.batch_size, 1, MAX_BATCH)
        self.search_batch_size = check_int("search_batch_size", cfg.search_batch_size, 1, MAX_BATCH)
        check_optional_int("nprobe", cfg.nprobe, 1, INT32_MAX, " (null = as saved in the index)")
        check_optional_int("ef_search", cfg.ef_search, 1, INT32_MAX, " (null = as saved in the index)")
        check_max_length(cfg.max_length)  # the model's own bound once it is loaded
        device = self._check_precision(cfg)  # before anything is loaded
        self.index_path, self.run_dir = Path(index), run_dir
        _check_model_exists(run_dir)  # a missing path is "not found", not "an index of another model"
        # an index from another model or passages file is refused before anything is loaded or encoded
        check_index_matches(self.index_path, run_dir, passages if isinstance(passages, (str, Path)) else None)
        self.index, self.ids = load_index(self.index_path, device=cfg.index_device, nprobe=cfg.nprobe,
                                          ef_search=cfg.ef_search)
        self._load_model(device, cfg)
        self.store = PassageStore(passages, cache_dir=cache_dir) if passages is not None else None

    def _check_precision(self, cfg: RetrieveConfig) -> str | None:
        """The device (checked: the one device rule's key, auto/null = the rule) and the resolved ``weights``."""
        from dpr.distributed import check_device
        from dpr.models.weights import resolve_weights

        device = check_device(cfg.device)
        self.weights = resolve_weights(cfg.weights, device, cfg.autocast)
        return device

    def _load_model(self, device: str | None, cfg: RetrieveConfig) -> None:
        """The question tower on its device in its precision, checked against the loaded index."""
        import torch

        from dpr.distributed import device as default_device
        from dpr.index import read_index_meta
        from dpr.models import load_biencoder
        from dpr.models.weights import cast_weights, inference_autocast

        self.device = torch.device(device) if device else default_device()
        self.model, self.tokenizer = load_biencoder(str(self.run_dir))
        self.max_length = check_max_length(cfg.max_length, self.model.question_encoder)
        cast_weights(self.model.to(self.device), self.weights)
        self.autocast = inference_autocast(self.weights, cfg.autocast)
        self._check_index(read_index_meta(self.index_path))

    def _check_index(self, meta: dict) -> None:
        """The index's dimension against the model's: equal, or a recorded Matryoshka truncation (the questions are
        then cut alike: ``truncate_dim``); the similarity the passages were normalised for."""
        from dpr.index.fingerprint import check_index_dim

        dim, config, d = int(self.model.dim), self.model.config, int(self.index.d)
        self.truncate_dim: int | None = None
        if d < dim and not meta:  # an index built elsewhere: nothing records what its vectors are
            log.warning("%s: %d-dim vectors, the model's are %d-dim, and no metadata (%s.json): taking them as "
                        "Matryoshka-truncated (the questions are cut to %d)", self.index_path, d, dim,
                        self.index_path.name, d)
            self.truncate_dim = d
        elif d != dim:
            self.truncate_dim = check_index_dim(self.index_path, {**meta, "dim": d}, dim, self.run_dir)
        cosine = config.similarity == "cosine"
        if "normalized" in meta and bool(meta["normalized"]) != cosine:
            log.warning("%s holds %s passage vectors but the model uses %s similarity: scores will not match "
                        "the model's", self.index_path, "normalised" if meta["normalized"] else "raw",
                        config.similarity)

    def encode(self, questions: Sequence[str]) -> np.ndarray:
        """Question vectors, float32 ``[N, D]`` (D: the index's, the model's vectors truncated to it by the rule
        that cut the passages, `dpr.models.truncate`, when the index holds truncated ones)."""
        from dpr.models import EncodeOptions, encode_texts
        from dpr.models.truncate import truncate

        options = EncodeOptions(batch_size=self.batch_size, max_length=self.max_length, device=self.device,
                                autocast=self.autocast, progress=len(questions) > self.batch_size)
        vectors = encode_texts(self.model, self.tokenizer, list(questions), "question", options)
        return truncate(vectors, self.truncate_dim, self.model.config.similarity == "cosine").numpy()

    def _search_ids(self, questions: list[str], k: int) -> list[Ranked]:
        from dpr.index import search

        if not questions:
            return []
        hits, scores = search(self.index, self.ids, self.encode(questions), k, batch_size=self.search_batch_size,
                              progress=len(questions) > self.search_batch_size)
        return [[(pid, float(s)) for pid, s in zip(row, srow)] for row, srow in zip(hits, scores.tolist())]

    def passage_ids(self) -> Sequence[str] | None:
        return self.ids


class HybridRetriever(Retriever):
    """Per-question fusion of a BM25 and a dense retriever (`dpr.retrieval.fusion.fuse_ranked`, the rule that
    ``dpr-retrieve mode=hybrid`` applies to result files)."""

    name = "hybrid"

    def __init__(self, bm25: Retriever, dense: Retriever, weight: float | None = None, *, fusion: str = "linear",
                 normalize: str = "minmax", k_rrf: float = 60, depth: int = 100) -> None:
        from dpr.retrieval.fusion import FUSIONS, check_k_rrf, check_normalize, check_weight

        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
        if fusion == "linear" and weight is None:
            raise ValueError("linear fusion needs weight= (the pipeline's dev-tuned weight is in "
                             "<run>/hybrid/weight.json), or use fusion='rrf'")
        for name, r in (("bm25", bm25), ("dense", dense)):
            if not isinstance(r, Retriever):
                raise TypeError(f"{name} must be a Retriever (Retriever.bm25 / Retriever.dense), "
                                f"got {type(r).__name__}")
        check_same_passages(bm25, dense)
        self.bm25_retriever, self.dense_retriever = bm25, dense
        self.how: dict[str, Any] = ({"k_rrf": check_k_rrf(k_rrf)} if fusion == "rrf"
                                    else {"weight": check_weight(weight), "normalize": check_normalize(normalize)})
        self.depth = _check_k(depth, "depth")
        self.store = dense.store if dense.store is not None else bm25.store

    def _search_ids(self, questions: list[str], k: int) -> list[Ranked]:
        from dpr.retrieval.fusion import fuse_ranked

        depth = max(self.depth, k)
        b = self.bm25_retriever._search_ids(questions, depth)
        d = self.dense_retriever._search_ids(questions, depth)
        return [fuse_ranked(br, dr, k, **self.how) for br, dr in zip(b, d)]

    def passage_ids(self) -> Sequence[str] | None:
        return self.dense_retriever.passage_ids()


def check_same_passages(bm25: Retriever, dense: Retriever) -> None:
    """Refuse (ValueError, one line) to fuse retrievers over different passages: a fused score adds a BM25 score of
    one corpus to a dense score of another, and passages that only one of them holds are ranked by half a score."""
    a, b = bm25.passage_ids(), dense.passage_ids()
    if a is None or b is None or list(a) == list(b):
        return
    only_a, only_b = set(a) - set(b), set(b) - set(a)
    if not only_a and not only_b and len(a) == len(b):
        return  # the same passages, in another order
    example = (f"{next(iter(sorted(only_a)))!r} only in the BM25 index" if only_a
               else f"{next(iter(sorted(only_b)))!r} only in the dense index" if only_b else "repeated ids")
    raise ValueError(f"hybrid: the BM25 index holds {len(a)} passages and the dense index {len(b)}, not the same "
                     f"passages ({len(only_a)} only in BM25, {len(only_b)} only in dense; e.g. {example}): build "
                     "both from one passages file")
