"""Where the files of a prepared dataset ``<data_dir>/<name>/`` live (the layout `dpr-data` writes)."""

from __future__ import annotations

from pathlib import Path

from dpr.data._io import load_json_file
from dpr.errors import DataError

SPLITS = ("train", "dev", "test")


class DatasetPaths:
    """Paths of one prepared dataset. ``kind`` comes from ``meta.json`` ("qa" or "qrels"); without a
    meta file it is inferred (``queries.jsonl`` present → "qrels", else "qa")."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @classmethod
    def of(cls, data_dir: str | Path, name: str) -> "DatasetPaths":
        return cls(Path(data_dir) / name)

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def passages(self) -> Path:
        return self.root / "passages.tsv"

    @property
    def train(self) -> Path:
        return self.root / "train.json"

    @property
    def dev(self) -> Path:
        return self.root / "dev.json"

    @property
    def test_qa(self) -> Path:
        return self.root / "test.qa.tsv"

    @property
    def dev_qa(self) -> Path:
        return self.root / "dev.qa.tsv"

    def qa(self, split: str) -> Path:
        """``<split>.qa.tsv`` (QA data: questions with answer strings)."""
        return self.root / f"{split}.qa.tsv"

    @property
    def queries(self) -> Path:
        return self.root / "queries.jsonl"

    def qrels(self, split: str = "test") -> Path:
        return self.root / "qrels" / f"{split}.tsv"

    @property
    def meta(self) -> Path:
        return self.root / "meta.json"

    def read_meta(self) -> dict:
        """The parsed ``meta.json`` ({} when absent)."""
        if not self.meta.is_file():
            return {}
        meta = load_json_file(self.meta)
        if not isinstance(meta, dict):
            raise DataError(self.meta, "expected a JSON object", field="meta")
        return meta

    @property
    def kind(self) -> str:
        kind = self.read_meta().get("kind")
        if kind is None:
            return "qrels" if self.queries.is_file() else "qa"
        if kind not in ("qa", "qrels"):
            raise DataError(self.meta, f"expected 'qa' or 'qrels', got {kind!r}", field="kind")
        return kind

    @property
    def has_qrels(self) -> bool:
        """Whether this is qrels data (queries + graded judgements, scored by nDCG) rather than QA data
        (questions + answer strings, scored by top-k answer match)."""
        return self.kind == "qrels"

    def exists(self) -> bool:
        return self.root.is_dir()

    def __repr__(self) -> str:
        return f"DatasetPaths({str(self.root)!r})"

    def __fspath__(self) -> str:
        return str(self.root)


def dataset_paths(data_dir: str | Path, name: str) -> DatasetPaths:
    return DatasetPaths.of(data_dir, name)


