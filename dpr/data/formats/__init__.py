"""Training sets in the formats peers use, in and out of the project's prepared layout.

One module per format, each with ``read(path, collector, split, corpus)`` (records into a
`dpr.data.formats.common.Collector`), ``write(path, examples, scores) -> counts``, ``EXTENSIONS`` and
``HAS_SCORES``. ``data=import`` (`dpr.data.prepare.import_`) reads; `dpr.data.formats.export` writes.
"""

from __future__ import annotations

from types import ModuleType

from dpr.data.formats import flagembedding, sentence_transformers, tevatron, triples

FORMATS: dict[str, ModuleType] = {
    "tevatron": tevatron,
    "flagembedding": flagembedding,
    "sentence_transformers": sentence_transformers,
    "triples": triples,
}

__all__ = ["FORMATS"]
