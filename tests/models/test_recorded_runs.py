"""Runs recorded before the backbone seam: they load, save the same biencoder.json, and their pipeline stages and
run comparisons see the same parameters (so every stage stays up to date and no run is refused as changed).

``data/pre_seam_records.json`` was written by ``data/record_presets.py`` on the code before the seam (commit
e78fb83): for each model preset, the model and train parameters the pipeline's stages record, the config a saved
run's biencoder.json holds, and what `dpr.run_dir` compares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpr.models import encode_texts, load_biencoder, save_biencoder

HERE = Path(__file__).parent
REPO = HERE.parents[1]
# biencoder.json exactly as the code before the seam wrote it (keys in its order, its indentation)
PRE_SEAM_DOC = {"format": "dpr.biencoder", "version": 1, "config": {
    "name": "NAME", "shared": False, "pooling": "mean", "projection_dim": 8, "similarity": "cosine",
    "temperature": 0.05, "question_max_length": 32, "passage_max_length": 64, "attn_implementation": "auto",
    "question_prefix": "", "passage_prefix": ""}}


def test_the_presets_record_what_they_recorded_before_the_seam():
    proc = subprocess.run([sys.executable, str(HERE / "data" / "record_presets.py")], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "WANDB_MODE": "disabled"},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == json.loads((HERE / "data" / "pre_seam_records.json").read_text())


def test_a_run_saved_before_the_seam_loads_and_resaves_the_same_file(tiny_model_dir, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    run = tmp_path / "run"
    torch.manual_seed(0)
    for tower in ("question_encoder", "passage_encoder"):
        AutoModel.from_pretrained(str(tiny_model_dir)).save_pretrained(run / tower)
        AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(run / tower)
    from safetensors.torch import save_file

    save_file({f"{t}.{k}": torch.randn(8, 32) if k == "weight" else torch.randn(8) for t in ("question", "passage")
               for k in ("weight", "bias")}, str(run / "projection.safetensors"))
    doc = {**PRE_SEAM_DOC, "config": {**PRE_SEAM_DOC["config"], "name": str(tiny_model_dir)}}
    text = json.dumps(doc, indent=2)
    (run / "biencoder.json").write_text(text, encoding="utf-8")
    model, tok = load_biencoder(run)
    assert model.config.dtype == "fp32" and model.config.lora is None and not model.decoder
    vecs = encode_texts(model, tok, ["who wrote hamlet"], "question", autocast="off")
    assert vecs.shape == (1, 8)
    save_biencoder(model, tok, tmp_path / "again")
    written = (tmp_path / "again" / "biencoder.json").read_text(encoding="utf-8")
    from dpr.atomic import write_json_atomic

    write_json_atomic(tmp_path / "reference.json", doc)  # the writer both versions use
    assert written == (tmp_path / "reference.json").read_text(encoding="utf-8")
    from dpr.index.fingerprint import model_dim

    assert model_dim(run) == 8


@pytest.mark.parametrize("key,value", [("dtype", "bf16"), ("gradient_checkpointing", True), ("padding_side", "left"),
                                       ("lora", {"r": 4})])
def test_a_backbone_key_when_set_is_recorded(key, value):
    from dpr.models import BiEncoderConfig
    from dpr.models.biencoder import without_empty_prefixes

    saved = BiEncoderConfig(**{key: value}).to_dict()
    assert key in saved and key in without_empty_prefixes(saved)
    assert key not in BiEncoderConfig().to_dict()
