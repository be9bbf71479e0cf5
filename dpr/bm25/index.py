"""A BM25 index over a passage collection, in `bm25s`' format (sparse, precomputed weights; no Java).

Passages are indexed as ``title + " " + text``, tokenized once in a stream by bm25s' `Tokenizer`
(lower-cased word runs of 2+ characters, optional stopword removal and Snowball stemming), so texts
never sit in a Python list; the token ids are packed into one int32 array and the BM25 weights are
computed from it with numpy (`dpr.bm25.weights`, bit-identical to bm25s' own ``index()``). The index
on disk is bm25s' own files plus the tokenizer vocabulary, the passage ids in index order, and
``dpr_bm25.json`` (parameters and the key of the passages file).

A corpus of more than ``shard_passages`` passages is built in shards of that many (`dpr.bm25.shards`:
the build's peak memory is set by the shard size), saved as one CSC per shard under ``shards/`` and
memory-mapped when loaded; its weights and search results are those of the one-shot build.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from tqdm import tqdm

from dpr.atomic import atomic_path, check_can_write, check_replaceable, write_json_atomic
from dpr.bm25.config import METHOD, BM25BuildConfig, BM25Config
from dpr.bm25.shards import Shard, build_shards, copy_shards, load_shards
from dpr.bm25.weights import bm25_csc, pack_tokens
from dpr.checks import MAX_K1, check_float, check_int
from dpr.errors import DataError

log = logging.getLogger(__name__)

# BM25Config's defaults (dpr/bm25/config.py), as the functions' keyword defaults
_DEFAULTS = BM25Config()
DEFAULT_K1 = _DEFAULTS.k1
DEFAULT_B = _DEFAULTS.b
DEFAULT_STOPWORDS = _DEFAULTS.stopwords
DEFAULT_STEMMER = _DEFAULTS.stemmer
FORMAT_VERSION = 1
# the format of a sharded index's dpr_bm25.json (not bm25s' files: an older reader refuses it by this number)
SHARDED_FORMAT = 2
DEFAULT_SHARD_PASSAGES = BM25BuildConfig().shard_passages
META_FILE = "dpr_bm25.json"
IDS_FILE = "passage_ids.txt"


@dataclass
class BM25Index:
    """A searchable BM25 index: bm25s retriever, its tokenizer, and passage ids in index order.

    A sharded index has ``shards`` (memory-mapped from ``shard_root``) and no bm25s retriever (None)."""

    retriever: Any  # bm25s.BM25, or None when sharded
    tokenizer: Any  # bm25s.tokenization.Tokenizer
    ids: list[str]
    params: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    shards: list[Shard] | None = None
    shard_root: Path | None = None
    # every posting list's rows ascend: our builders write them so and the meta file records it; an index without
    # the record (another tool's) is checked once before it is searched, which reads all of its postings
    rows_ascend: bool = False
    # the postings in the search kernels' form, with each term's largest weight (dpr.bm25.search; made on first use)
    search_lists: list[Any] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.ids)

    def postings(self) -> list[Shard]:
        """The index's postings, shard by shard (one shard, starting at row 0, when not sharded)."""
        return self.shards if self.shards is not None else [Shard(0, self.retriever.scores)]


def _bm25s():
    """Import bm25s, undoing the DEBUG level it forces on its logger at import (it would print
    "Building index from IDs" through any INFO handler, e.g. the CLI's)."""
    import bm25s

    lg = logging.getLogger("bm25s")
    if lg.level == logging.DEBUG:
        lg.setLevel(logging.WARNING)
    return bm25s


def check_bm25_params(k1: Any = None, b: Any = None) -> None:
    """k1 finite in [0, 1000] (0 = term frequency ignored), b in [0, 1] (length normalisation share);
    None = the default. NaN or a huge k1 would make every score NaN or 0."""
    if k1 is not None:
        check_float("k1", k1, 0.0, MAX_K1)
    if b is not None:
        check_float("b", b, 0.0, 1.0)


def index_params(k1: float = DEFAULT_K1, b: float = DEFAULT_B, stopwords: str | None = DEFAULT_STOPWORDS,
                 stemmer: str | None = DEFAULT_STEMMER) -> dict[str, Any]:
    """The parameters that define an index, normalised (``none``/``""``/``False`` mean off)."""
    def off(v: Any) -> Any:
        return None if v in (None, False, "", "none", "None", "null") else v
    check_bm25_params(k1, b)
    return {"k1": float(k1), "b": float(b), "stopwords": off(stopwords), "stemmer": off(stemmer), "method": METHOD}


def make_tokenizer(stopwords: str | None, stemmer: str | None):
    """bm25s' streaming tokenizer with the chosen stopword list and PyStemmer (Snowball) algorithm."""
    bm25s = _bm25s()

    stem = None
    if stemmer:
        import Stemmer

        try:
            stem = Stemmer.Stemmer(stemmer)
        except KeyError:
            raise ValueError(f"unknown stemmer {stemmer!r}; PyStemmer knows {sorted(Stemmer.algorithms())}") from None
    return bm25s.tokenization.Tokenizer(lower=True, stopwords=stopwords or [], stemmer=stem)


def passage_text(row: Mapping[str, str]) -> str:
    """What BM25 sees of a passage: its title, a space, its text (pyserini's "contents" for DPR)."""
    title = row.get("title") or ""
    return f"{title} {row['text']}" if title else row["text"]


def build_index_from_rows(
    rows: Iterable[Mapping[str, str]],
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    stopwords: str | None = DEFAULT_STOPWORDS,
    stemmer: str | None = DEFAULT_STEMMER,
    total: int | None = None,
    shard_passages: int = DEFAULT_SHARD_PASSAGES,
    workdir: str | Path | None = None,
) -> BM25Index:
    """Index passages given as ``{"id", "title", "text"}`` dicts (streamed once). Above ``shard_passages``
    passages the index is built in shards of that many, written under ``workdir`` (a temporary folder,
    removed with the index, when None)."""
    bm25s = _bm25s()

    params = index_params(k1, b, stopwords, stemmer)
    check_int("shard_passages", shard_passages, 1)
    tokenizer = make_tokenizer(params["stopwords"], params["stemmer"])
    ids: list[str] = []

    def texts() -> Iterator[str]:
        for row in rows:
            ids.append(row["id"])
            yield passage_text(row)

    stream = iter(tqdm(tokenizer.streaming_tokenize(texts(), update_vocab=True), total=total,
                       desc="BM25 tokenize", unit="psg", mininterval=1.0))
    flat, offsets = pack_tokens(islice(stream, shard_passages))
    if not ids:
        raise ValueError("no passages to index")
    more = next(stream, None)
    if more is not None:
        return _build_sharded(tokenizer, ids, params, (flat, offsets), chain([more], stream), shard_passages,
                              workdir)
    vocab = tokenizer.get_vocab_dict()
    retriever = bm25s.BM25(k1=params["k1"], b=params["b"], method=params["method"])
    # the weights bm25s' own index() would compute, in numpy (see dpr.bm25.weights)
    retriever.scores = bm25_csc(flat, offsets, len(vocab), params["k1"], params["b"])
    retriever.vocab_dict = vocab
    retriever.unique_token_ids_set = set(vocab.values())
    retriever.nonoccurrence_array = None
    log.info("BM25 index: %d passages, %d terms (k1=%s b=%s stopwords=%s stemmer=%s)", len(ids),
             len(tokenizer.get_vocab_dict()), params["k1"], params["b"], params["stopwords"], params["stemmer"])
    return BM25Index(retriever=retriever, tokenizer=tokenizer, ids=ids, params=params, rows_ascend=True)


def _build_sharded(tokenizer, ids: list[str], params: dict[str, Any], first, stream, shard_passages: int,
                   workdir: str | Path | None) -> BM25Index:
    owned = workdir is None
    root = Path(tempfile.mkdtemp(prefix="dpr_bm25_")) if owned else Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    try:
        shards = build_shards(first, stream, shard_passages, lambda: len(tokenizer.get_vocab_dict()),
                              params["k1"], params["b"], root)
    except BaseException:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
        raise
    log.info("BM25 index: %d passages in %d shards, %d terms (k1=%s b=%s stopwords=%s stemmer=%s)", len(ids),
             len(shards), len(tokenizer.get_vocab_dict()), params["k1"], params["b"], params["stopwords"],
             params["stemmer"])
    index = BM25Index(retriever=None, tokenizer=tokenizer, ids=ids, params=params, shards=shards, shard_root=root,
                      rows_ascend=True)  # postings_csc sorts by term, then passage
    if owned:
        weakref.finalize(index, shutil.rmtree, str(root), True)
    return index


def build_index(
    passages_path: str | Path,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    stopwords: str | None = DEFAULT_STOPWORDS,
    stemmer: str | None = DEFAULT_STEMMER,
    shard_passages: int = DEFAULT_SHARD_PASSAGES,
) -> BM25Index:
    """Index a ``passages.tsv`` (validated while streamed); in shards above ``shard_passages`` passages."""
    from dpr.data.passages import count_passages, iter_passages

    passages_path = Path(passages_path)
    index = build_index_from_rows(iter_passages(passages_path), k1=k1, b=b, stopwords=stopwords,
                                  stemmer=stemmer, total=count_passages(passages_path), shard_passages=shard_passages)
    index.meta = {"passages": passages_key(passages_path)}
    return index


def passages_key(passages_path: str | Path) -> dict[str, Any]:
    """Size and mtime of the passages file: cheap to get for a 13 GB corpus, and any rewrite changes it."""
    st = Path(passages_path).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def index_key(passages_path: str | Path, params: Mapping[str, Any]) -> str:
    blob = json.dumps({"format": FORMAT_VERSION, "params": dict(params), "passages": passages_key(passages_path)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _is_index(index_dir: Path) -> bool:
    return (index_dir / META_FILE).is_file()


def save_index(index: BM25Index, index_dir: str | Path) -> Path:
    """Write the index to ``index_dir`` (aside, then renamed: a crash never leaves half an index)."""
    bm25s = _bm25s()

    index_dir = Path(index_dir)
    # only an index (its meta file) is replaced: index_dir= naming the user's directory is refused
    with atomic_path(index_dir, owned=_is_index) as tmp:
        tmp.mkdir(parents=True)
        if index.shards is None:
            index.retriever.save(tmp, show_progress=False)
            layout: dict[str, Any] = {"format": FORMAT_VERSION}
        else:
            copy_shards(index.shard_root, tmp, len(index.shards))
            layout = {"format": SHARDED_FORMAT,
                      "shards": [{"start": sh.start, "passages": sh.num_docs} for sh in index.shards]}
        index.tokenizer.save_vocab(tmp)
        with open(tmp / IDS_FILE, "w", encoding="utf-8", newline="\n") as f:
            for pid in index.ids:
                f.write(pid + "\n")
        write_json_atomic(tmp / META_FILE, {
            **layout, "params": index.params, "num_passages": len(index.ids),
            "bm25s_version": bm25s.__version__, **index.meta, **({"rows_ascend": True} if index.rows_ascend else {}),
        })
    return index_dir


def load_index(index_dir: str | Path, mmap: bool = False) -> BM25Index:
    """Load an index written by `save_index` (a sharded one memory-mapped, whatever ``mmap``)."""
    bm25s = _bm25s()

    index_dir = Path(index_dir)
    meta_path = index_dir / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no BM25 index at {index_dir} ({META_FILE} missing)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") not in (FORMAT_VERSION, SHARDED_FORMAT):
        raise DataError(meta_path, f"index format {meta.get('format')!r}, expected {FORMAT_VERSION} or "
                        f"{SHARDED_FORMAT}", field="format")
    params = meta["params"]
    if meta["format"] == SHARDED_FORMAT:
        retriever, shards = None, load_shards(index_dir, meta["shards"])
        indexed = sum(sh.num_docs for sh in shards)
    else:
        retriever, shards = bm25s.BM25.load(index_dir, mmap=mmap), None
        indexed = retriever.scores["num_docs"]
    tokenizer = make_tokenizer(params["stopwords"], params["stemmer"])
    tokenizer.load_vocab(index_dir)
    ids = (index_dir / IDS_FILE).read_text(encoding="utf-8").splitlines()
    if len(ids) != meta["num_passages"] or len(ids) != indexed:
        raise DataError(index_dir / IDS_FILE, f"{len(ids)} ids for {indexed} indexed passages", field="id")
    extra = {k: v for k, v in meta.items()
             if k not in ("format", "params", "num_passages", "bm25s_version", "shards", "rows_ascend")}
    return BM25Index(retriever=retriever, tokenizer=tokenizer, ids=ids, params=params, meta=extra, shards=shards,
                     shard_root=index_dir if shards is not None else None, rows_ascend=meta.get("rows_ascend") is True)


def get_or_build_index(passages_path: str | Path, index_dir: str | Path,
                       shard_passages: int = DEFAULT_SHARD_PASSAGES, **params: Any) -> BM25Index:
    """Load the cached index in ``index_dir`` if it was built from this passages file with these
    parameters; otherwise build it (in shards of ``shard_passages`` passages above that many) and save it
    there. The shard size is not part of the key: any shard size gives the same weights and results."""
    passages_path = Path(passages_path)
    params = index_params(**params)
    key = index_key(passages_path, params)
    index_dir = Path(index_dir)
    meta_path = index_dir / META_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("key") == key:
            log.info("reusing BM25 index %s", index_dir)
            return load_index(index_dir)
        log.info("BM25 index %s is stale (other passages or parameters): rebuilding", index_dir)
    check_replaceable(index_dir, directory=True, owned=_is_index)  # before the build, not after it
    check_can_write(index_dir)  # a read-only place (or a file above it) is named before the build, too
    index = build_index(passages_path, shard_passages=shard_passages,
                        **{k: v for k, v in params.items() if k != "method"})
    index.meta["key"] = key
    save_index(index, index_dir)
    # a sharded build's shards are read from their saved copy (the build's temporary folder then goes)
    return index if index.shards is None else load_index(index_dir)
