"""BM25 baseline (bm25s): index, search, retrieval to results files, and hard-negative mining."""

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
from dpr.bm25.mine import mine_dataset, mine_hard_negatives, mining_up_to_date
from dpr.bm25.retrieve import (
    iter_qa_results,
    retrieve_qa,
    retrieve_qrels,
    retrieve_split,
    retrieve_to_results,
    split_queries,
    write_qa_results,
    write_qrels_run,
)

__all__ = [
    "DEFAULT_B", "DEFAULT_K1", "DEFAULT_STEMMER", "DEFAULT_STOPWORDS", "BM25Index", "build_index",
    "build_index_from_rows", "get_or_build_index", "load_index", "save_index", "search", "search_indices",
    "mine_dataset", "mine_hard_negatives", "mining_up_to_date", "iter_qa_results", "retrieve_qa",
    "retrieve_qrels", "retrieve_split", "retrieve_to_results", "split_queries", "write_qa_results",
    "write_qrels_run",
]
