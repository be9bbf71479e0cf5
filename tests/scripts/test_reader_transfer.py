"""scripts/transfer_matrix.py end to end on tiny data: two QA datasets and one qrels dataset, BM25,
the untrained model and two "trained" run dirs, one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_tiny_dataset
from tests.scripts import script

REPO = Path(__file__).resolve().parents[2]


def _script():
    return script("transfer_matrix")


def _qrels_dataset(root: Path) -> None:
    write_tiny_dataset(root)
    (root / "test.qa.tsv").unlink()
    qs = [("q1", "capital of hawaii", "p1"), ("q2", "largest ocean", "p6"), ("q3", "boiling water", "p7")]
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t, _ in qs))
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{p}\t1\n" for q, _, p in qs))
    (root / "meta.json").write_text(json.dumps({"name": root.name, "kind": "qrels"}))


def _run_dir(tiny_model_dir: Path, out: Path, seed: int) -> Path:
    import torch

    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    torch.manual_seed(seed)
    cfg = BiEncoderConfig.from_dict({"name": str(tiny_model_dir), "shared": False, "pooling": "cls",
                                     "similarity": "dot", "question_max_length": 32, "passage_max_length": 64})
    model, tok = build_biencoder(cfg)
    save_biencoder(model, tok, out)
    return out


def test_transfer_matrix_end_to_end(tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    write_tiny_dataset(data / "qa_a")
    write_tiny_dataset(data / "qa_b")
    _qrels_dataset(data / "ir_c")
    runs = [f"qa_a={_run_dir(tiny_model_dir, tmp_path / 'run_a', 1)}",
            f"qa_b={_run_dir(tiny_model_dir, tmp_path / 'run_b', 2)}"]
    tm = _script()
    out = tmp_path / "transfer"
    argv = ["--data-dir", str(data), "--datasets", "qa_a", "qa_b", "ir_c", "--out", str(out), "--k", "5",
            "--untrained-config", str(REPO / "conf" / "model" / "tiny.yaml"), "--untrained-model", str(tiny_model_dir),
            "--batch-size", "8"]
    for r in runs:
        argv += ["--run", r]
    assert tm.main(argv) == 0
    matrix = json.loads((out / "transfer.json").read_text())
    assert matrix["metric"] == {"qa_a": "top-20", "qa_b": "top-20", "ir_c": "ndcg@10"}
    assert set(matrix["table"]) == {"bm25", "untrained", "trained on qa_a", "trained on qa_b"}
    for row in matrix["table"].values():
        assert set(row) == {"qa_a", "qa_b", "ir_c"} and all(0.0 <= v <= 1.0 for v in row.values())
    # BM25 on the toy sets: total lexical overlap, every answer in the top 5 (top-20 uses what is there)
    assert matrix["table"]["bm25"]["qa_a"] == 1.0
    md = (out / "transfer.md").read_text()
    assert "| trained on qa_a |" in md and "*" in md.split("| trained on qa_a |")[1].split("\n")[0]
    assert (out / "ir_c" / "eval" / "report.json").is_file()
    with pytest.raises(FileNotFoundError, match="not a dpr-train run dir"):
        tm.parse_runs([f"x={tmp_path}"])
