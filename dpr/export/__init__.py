"""Exports of trained runs for where users serve them: sentence-transformers (`dpr-export`)."""

from dpr.export.check import compare_export
from dpr.export.config import FORMATS, ExportConfig
from dpr.export.sentence_transformers import build_sentence_transformer, export_sentence_transformers

__all__ = ["FORMATS", "ExportConfig", "build_sentence_transformer", "compare_export", "export_sentence_transformers"]
