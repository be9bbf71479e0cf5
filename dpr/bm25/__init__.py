"""The BM25 lexical engine (bm25s): index, search and the numpy weights. Retrieval to files is
`dpr.retrieval` (`Retriever.bm25`), hard-negative mining `dpr.negatives.bm25`."""

from dpr.bm25.index import (
    DEFAULT_B,
    DEFAULT_K1,
    DEFAULT_STEMMER,
    DEFAULT_STOPWORDS,
    BM25Index,
    build_index,
    build_index_from_rows,
    get_or_build_index,
    load_index,
    save_index,
)
from dpr.bm25.search import search, search_indices

__all__ = [
    "DEFAULT_B", "DEFAULT_K1", "DEFAULT_STEMMER", "DEFAULT_STOPWORDS", "BM25Index", "build_index",
    "build_index_from_rows", "get_or_build_index", "load_index", "save_index", "search", "search_indices",
]
