"""dpr: dense passage retriever training, export, indexing and evaluation.

``from dpr import Retriever`` is the Python search API (`dpr.retrieval`); it is imported on first use so
that ``import dpr`` stays light.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Retriever", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Retriever":
        from dpr.retrieval import Retriever

        return Retriever
    raise AttributeError(f"module 'dpr' has no attribute {name!r}")
