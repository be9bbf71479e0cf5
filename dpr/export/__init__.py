"""Exports of trained runs for where users serve them: sentence-transformers (`dpr-export`)."""

from dpr.export.check import compare_export
from dpr.export.sentence_transformers import build_sentence_transformer, export_sentence_transformers

FORMATS = ("sentence-transformers",)

__all__ = ["FORMATS", "build_sentence_transformer", "compare_export", "export_sentence_transformers"]
