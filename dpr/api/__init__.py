"""The Python API: `Retriever` (BM25, dense, hybrid) with ``search(questions, k)``, and the record
writers the CLI and the pipeline use (`dpr.api.records`)."""

from dpr.api.passages import PassageStore, fetch_passages
from dpr.api.retriever import BM25Retriever, DenseRetriever, Hit, HybridRetriever, Retriever

__all__ = ["Retriever", "BM25Retriever", "DenseRetriever", "HybridRetriever", "Hit", "PassageStore",
           "fetch_passages"]
