"""``dpr-export format=sentence-transformers dim=d``: the copy records ``truncate_dim`` (sentence-transformers reads it
back), its vectors are dpr's cut by `dpr.models.truncate` (re-normalised on request for a cosine model), and the
card says so; a size larger than the model's is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.export.test_export import PASSAGES, QUESTIONS, TITLES, export_cli, make_run


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_export_with_dim_records_truncate_dim_and_matches_truncated_vectors(tiny_model_dir, tmp_path, similarity):
    from sentence_transformers import SentenceTransformer

    from dpr.export import compare_export
    from dpr.models import encode_texts, load_biencoder
    from dpr.models.truncate import truncate

    run_dir = make_run(tiny_model_dir, tmp_path / "run", shared=False, pooling="mean", similarity=similarity)
    out = tmp_path / "st"
    proc = export_cli(run_dir, out, "dim=16", "check=true")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config_sentence_transformers.json").read_text())["truncate_dim"] == 16
    st = SentenceTransformer(str(out), device="cpu", local_files_only=True)
    assert st.truncate_dim == 16 and st.encode_query(["x"]).shape == (1, 16)
    # dpr's vectors cut by its rule = the export's (re-normalised for cosine): |Δ| <= 1e-5 in fp32
    model, tok = load_biencoder(str(run_dir))
    ours = truncate(encode_texts(model, tok, QUESTIONS, "question", autocast="off"), 16, similarity == "cosine")
    theirs = st.encode_query(QUESTIONS, normalize_embeddings=similarity == "cosine", convert_to_numpy=True)
    np.testing.assert_allclose(theirs, ours.numpy(), rtol=0, atol=1e-5)
    figures = compare_export(run_dir, out, QUESTIONS, PASSAGES, titles=TITLES, k=5)
    assert figures["max_abs_diff"] <= 1e-5 and figures["same_topk_order"] == len(QUESTIONS), figures
    card = (out / "README.md").read_text()
    assert "truncate_dim: 16" in card and ("normalize_embeddings=True" in card) is (similarity == "cosine")
    # without dim: no truncate_dim, as before
    proc = export_cli(run_dir, tmp_path / "full")
    assert proc.returncode == 0, proc.stderr
    assert "truncate_dim" not in json.loads((tmp_path / "full" / "config_sentence_transformers.json").read_text())
    assert "truncate_dim" not in (tmp_path / "full" / "README.md").read_text()


def test_export_dim_larger_than_the_model_is_one_line(tiny_model_dir, tmp_path):
    run_dir = make_run(tiny_model_dir, tmp_path / "run", shared=True)
    proc = export_cli(run_dir, tmp_path / "st", "dim=64")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "dim=64" in lines[0] and "32" in lines[0], proc.stderr
    assert not (tmp_path / "st").exists()
