"""The cross-encoder reranker: one relevance logit over ``[CLS] question [SEP] title [SEP] passage [SEP]``
(model, losses, grouped training data, training loop, scoring/reranking; see ARCHITECTURE.md)."""
