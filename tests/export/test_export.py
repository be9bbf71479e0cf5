"""sentence-transformers export: loads offline with `SentenceTransformer`, vectors equal the project's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_PASSAGES, TINY_QA
from tests.run_command import run_command

QUESTIONS = [q for q, _, _ in TINY_QA] + ["word " * 80]  # the last one is cut at the question max length
PASSAGES = [text for _, text, _ in TINY_PASSAGES] + ["long passage " * 60]
TITLES = [title for _, _, title in TINY_PASSAGES[:-1]] + ["", "Long"]  # one passage without a title


def make_run(tiny_model_dir: Path, out: Path, **config) -> Path:
    import torch

    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    torch.manual_seed(1)
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), **config))
    if not model.config.shared:  # make the towers differ, as training would
        with torch.no_grad():
            for p in model.passage_encoder.parameters():
                p.add_(0.05 * torch.randn_like(p))
    save_biencoder(model, tok, out)
    return out


def export_cli(run_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["dpr-export", f"model={run_dir}", "format=sentence-transformers", f"output={out}", *extra]
    return run_command(cmd, cwd=out.parent, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


@pytest.mark.parametrize("config", [
    {"shared": False, "pooling": "cls", "similarity": "cosine", "projection_dim": 16,
     "question_max_length": 12, "passage_max_length": 40},
    {"shared": True, "pooling": "mean", "similarity": "dot", "question_max_length": 16, "passage_max_length": 32},
    {"shared": False, "pooling": "mean", "similarity": "cosine", "question_max_length": 16, "passage_max_length": 40,
     "question_prefix": "query: ", "passage_prefix": "passage: "},
], ids=["separate-cls-cosine-projection", "shared-mean-dot", "separate-prefixes"])
def test_export_loads_offline_and_equals_the_project(tiny_model_dir, tmp_path, config):
    from sentence_transformers import SentenceTransformer

    from dpr.export import compare_export

    from dpr.export import export_sentence_transformers

    run_dir = make_run(tiny_model_dir, tmp_path / "run", **config)
    out = tmp_path / "st"
    if config["shared"]:
        export_sentence_transformers(run_dir, out)  # the function the CLI calls (the CLI: the other case)
    else:
        proc = export_cli(run_dir, out)
        assert proc.returncode == 0, proc.stderr
    assert (out / "README.md").is_file() and (out / "modules.json").is_file()

    st = SentenceTransformer(str(out), device="cpu", local_files_only=True)
    assert st.similarity_fn_name == ("cosine" if config["similarity"] == "cosine" else "dot")
    modules = json.loads((out / "modules.json").read_text())
    assert any(m["type"].endswith("Router") for m in modules) is (not config["shared"])
    assert any(m["type"].endswith("Normalize") for m in modules) is (config["similarity"] == "cosine")

    figures = compare_export(run_dir, out, QUESTIONS, PASSAGES, titles=TITLES, k=5)
    assert figures["min_cosine_questions"] >= 0.9999, figures
    assert figures["min_cosine_passages"] >= 0.9999, figures
    assert figures["same_topk_set"] == len(QUESTIONS), figures
    if config.get("question_prefix"):  # exported as the query / document prompts
        assert st.prompts["query"] == "query: " and st.prompts["document"] == "passage: "
    dim = st.encode_query(["x"]).shape[-1]
    assert dim == (config.get("projection_dim") or 32)


def test_separate_towers_really_route(tiny_model_dir, tmp_path):
    """A question and a passage of the same text get different vectors (their own towers)."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from dpr.export import export_sentence_transformers

    run_dir = make_run(tiny_model_dir, tmp_path / "run", shared=False, pooling="mean", similarity="cosine")
    export_sentence_transformers(run_dir, tmp_path / "st")
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu", local_files_only=True)
    q, p = st.encode_query(["capital of france"]), st.encode_document(["capital of france"])
    assert not np.allclose(q, p, atol=1e-4)


def test_shared_tower_prompts_and_check_flag(tiny_model_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from dpr.export import export_sentence_transformers

    run_dir = make_run(tiny_model_dir, tmp_path / "run", shared=True, pooling="mean", similarity="cosine")
    export_sentence_transformers(run_dir, tmp_path / "st", prompts={"query": "query:_"})
    assert SentenceTransformer(str(tmp_path / "st"), device="cpu").prompts["query"] == "query:_"
    plain = export_cli(run_dir, tmp_path / "plain", "check=true")
    assert plain.returncode == 0, plain.stderr
    figures = json.loads(plain.stdout.split("dpr-export: check ", 1)[1])
    assert figures["min_cosine_questions"] >= 0.9999 and figures["same_topk_order"] == figures["questions"]


def test_bad_export_requests(tiny_model_dir, tmp_path):
    proc = export_cli(tiny_model_dir, tmp_path / "st")  # a plain HF model, not a run directory
    assert proc.returncode == 2 and "biencoder.json" in proc.stderr
    assert not (tmp_path / "st").exists()
    run_dir = make_run(tiny_model_dir, tmp_path / "run")
    proc = export_cli(run_dir, tmp_path / "onnx", "format=onnx")
    assert proc.returncode == 2 and "format must be" in proc.stderr
    from dpr.errors import DataError
    from dpr.export import export_sentence_transformers

    with pytest.raises(DataError, match="would replace the run"):
        export_sentence_transformers(run_dir, tmp_path)
    assert (run_dir / "biencoder.json").is_file()
