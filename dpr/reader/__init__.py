"""An extractive reader on top of the retrievers: SQuAD EM/F1, windowing, span search, the model,
its training loop, and open-domain reading of a results file's top k (see ARCHITECTURE.md)."""
