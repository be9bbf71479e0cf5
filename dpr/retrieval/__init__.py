"""Retrieval: `Retriever` (BM25, dense, hybrid) with ``search(questions, k)``, the passage store
(`passages`), the output records (`records`), retrieval to files per split (`runs`) and fusion (`fusion`)."""

from dpr.retrieval.passages import PassageStore, fetch_passages
from dpr.retrieval.retriever import BM25Retriever, DenseRetriever, Hit, HybridRetriever, Retriever

__all__ = ["Retriever", "BM25Retriever", "DenseRetriever", "HybridRetriever", "Hit", "PassageStore",
           "fetch_passages"]
