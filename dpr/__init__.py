"""dpr: dense passage retriever training, export, indexing and evaluation.

``from dpr import Retriever`` is the Python search API (`dpr.retrieval`); it is imported on first use so
that ``import dpr`` stays light.
"""

import os
import sys
from typing import Any

# OpenMP reads its wait policy once, when torch loads it: set here, before any dpr module imports torch, so
# waiting threads yield instead of spinning against other busy processes (measurements: dpr/perf/threads.py).
OMP_WAIT_POLICY_TOO_LATE = "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["Retriever", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Retriever":
        from dpr.retrieval import Retriever

        return Retriever
    raise AttributeError(f"module 'dpr' has no attribute {name!r}")
