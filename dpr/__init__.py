"""dpr: dense passage retriever training, export, indexing and evaluation."""

__version__ = "0.1.0"
