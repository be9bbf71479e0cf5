"""Hard negatives for training: one false-negative filter (`filters`) behind every miner — any `Retriever`
(`mine`), BM25 into the prepared training files (`bm25`), and a trained model's own index (`dense`, for
``train.rounds``)."""
