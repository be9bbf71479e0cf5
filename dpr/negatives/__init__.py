"""Hard negatives for training: `bm25` mines them from a BM25 index, with the false-negative filter."""
