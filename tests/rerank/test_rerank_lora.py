"""LoRA for the cross-encoder (``rerank.model.lora``): only the adapters and the new head train; the saved directory
and the checkpoints hold them, not the base; it loads back to the same scores, is refused on another base, resumes
after a kill, scores and teacher-scores unchanged, and exports to a plain sentence-transformers model with our
scores."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.system.test_faults import _env, _run, _run_stopped_at
from tests.tiny_negatives import with_negatives

from dpr.errors import DataError
from dpr.models.lora import LoraSettings, is_trained_key
from dpr.rerank.adapters import saved_info
from dpr.rerank.config import RerankConfig
from dpr.rerank.model import build_cross_encoder, document_text, load_cross_encoder, save_cross_encoder
from dpr.rerank.score import score_pairs
from tests.run_command import run_as_subprocess

pytestmark = pytest.mark.usefixtures("one_thread")
CLI = [sys.executable, "-m", "dpr.cli.rerank"]
LORA = LoraSettings(r=4, alpha=8, dropout=0.0)
QUESTIONS = ["what is the capital of france", "who wrote hamlet", "at what temperature does water boil"]
DOCS = [("Paris", "Paris is the capital and most populous city of France."),
        ("Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
        ("Water", "Water boils at 100 degrees Celsius at sea level.")]
SETTINGS = {"max_length": 64, "title": True}


def _scores(model, tok) -> torch.Tensor:
    docs = [document_text(t, x, tok) for t, x in DOCS]
    return score_pairs(model, tok, [q for q in QUESTIONS for _ in docs], docs * len(QUESTIONS), autocast="fp32",
                       max_length=64)


def _randomise_trained(model: torch.nn.Module, seed: int = 3) -> None:
    """peft starts lora_B at zero (the base's logits): give the adapters and head weights that change the scores."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def _lora_model(base: Path):
    torch.manual_seed(0)
    return build_cross_encoder(str(base), lora=LORA)


def _results(path: Path) -> Path:
    """A first stage's results: every question with the three passages."""
    path.write_text(json.dumps([{"question": q, "answers": ["x"], "ctxs": [
        {"id": str(i), "title": t, "text": x, "score": 1.0} for i, (t, x) in enumerate(DOCS)]} for q in QUESTIONS]))
    return path


def _save(model, tok, base: Path, out: Path) -> Path:
    return save_cross_encoder(model, tok, out, SETTINGS, extra={"base_model": str(base), **saved_info(str(base), LORA)})


def test_only_the_adapters_and_the_new_head_receive_gradients(tiny_model_dir):
    model, tok = _lora_model(tiny_model_dir)
    model.train()
    batch = tok(QUESTIONS, [x for _, x in DOCS], padding=True, return_tensors="pt")
    model(**batch).logits.float().square().sum().backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    got = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trainable and all(is_trained_key(n) for n in trainable)
    assert {n for n in trainable if ".modules_to_save." in n} == {
        "base_model.model.classifier.modules_to_save.default.weight",
        "base_model.model.classifier.modules_to_save.default.bias"}
    # lora_B starts at 0, so lora_A's first gradient is 0: the head and every lora_B get one
    assert got == {n for n in trainable if "lora_B" in n or "classifier" in n}
    assert not any("lora_" in n for n, _ in model.named_parameters() if "classifier" in n)  # no adapters on the head
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert n_train < 0.05 * sum(p.numel() for p in model.parameters())
    assert set(model.state_dict()) == trainable  # what checkpoints hold


def test_a_saved_lora_cross_encoder_holds_adapters_and_head_and_loads_to_the_same_scores(tiny_model_dir, tmp_path):
    model, tok = _lora_model(tiny_model_dir)
    _randomise_trained(model)
    model.eval()
    ours = _scores(model, tok)
    out = _save(model, tok, tiny_model_dir, tmp_path / "ce")
    files = {p.name for p in (out / "encoder").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    head = [k for k in load_file(str(out / "encoder" / "adapter_model.safetensors")) if "classifier" in k]
    assert sorted(head) == ["base_model.model.classifier.bias", "base_model.model.classifier.weight"]
    doc = json.loads((out / "cross_encoder.json").read_text())
    assert doc["base_model"] == str(tiny_model_dir) and doc["lora"]["r"] == 4 and len(doc["base_fingerprint"]) == 64
    # far below a full copy: the adapters and head against the base's weights
    full = (tiny_model_dir / "model.safetensors").stat().st_size
    assert (out / "encoder" / "adapter_model.safetensors").stat().st_size < 0.02 * full
    rng = torch.get_rng_state()
    loaded, ltok, settings = load_cross_encoder(out, device="cpu")
    assert torch.equal(torch.get_rng_state(), rng)  # the base's fresh head is drawn aside
    assert settings["max_length"] == 64
    torch.testing.assert_close(_scores(loaded, ltok), ours, rtol=0, atol=1e-6)


def test_weights_the_base_checkpoint_lacks_train_whole_and_are_saved(tiny_model_dir, tmp_path):
    """A base saved without BERT's pooler: from_pretrained draws one, so the pooler trains (and is saved) with the
    head, with no adapters of its own; the loaded model gives the same scores (a redrawn pooler would not)."""
    from transformers import AutoTokenizer, BertModel

    base = tmp_path / "no_pooler"
    BertModel.from_pretrained(tiny_model_dir, add_pooling_layer=False).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(base)
    model, tok = _lora_model(base)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "base_model.model.bert.pooler.dense.modules_to_save.default.weight" in trained
    assert not any("pooler" in n and "lora_" in n for n in trained)
    _randomise_trained(model)
    model.eval()
    ours = _scores(model, tok)
    out = _save(model, tok, base, tmp_path / "ce")
    torch.manual_seed(123)  # another draw for the base's missing weights than at build time
    loaded, ltok, _ = load_cross_encoder(out, device="cpu")
    torch.testing.assert_close(_scores(loaded, ltok), ours, rtol=0, atol=1e-6)


def test_adapters_on_another_base_are_refused_in_one_line(tiny_model_dir, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    model, tok = _lora_model(base)
    out = _save(model, tok, base, tmp_path / "ce")
    weights = load_file(str(base / "model.safetensors"))
    save_file({k: v + 1 for k, v in weights.items()}, str(base / "model.safetensors"))
    with pytest.raises(DataError, match="base_fingerprint.*trained on another"):
        load_cross_encoder(out, device="cpu")
    results = _results(tmp_path / "dev.json")
    proc = run_as_subprocess(CLI + ["score", f"model={out}", f"results={results}", f"output={tmp_path / 'r.json'}"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "trained on another" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()


def _args(data: Path, base: Path, out: Path, *extra: str) -> list[str]:
    # the base given as model= (the name), the adapters as rerank.model.lora: the two spellings together
    return ["train", "data.name=tiny", f"data_dir={data}", f"output_dir={out}", f"model={base}",
            "rerank.model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [query, value]}",
            "rerank.max_length=64", "rerank.train.batch_size=3", "rerank.train.negatives=2", "rerank.train.lr=1e-2",
            "rerank.train.max_steps=6", "rerank.train.save_every=2", "rerank.train.keep_checkpoints=5",
            "rerank.train.precision=fp32", "rerank.train.cpu_threads=1", *extra]


@pytest.mark.slow
def test_a_killed_lora_run_resumes_to_the_same_adapters_then_scores(tiny_data_dir, tiny_model_dir, tmp_path):
    with_negatives(tiny_data_dir)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _run(CLI + _args(tiny_data_dir, tiny_model_dir, straight), tmp_path)
    stopped = _run_stopped_at("dpr.rerank.train:save_checkpoint", "after-2", "dpr.cli.rerank:main",
                              _args(tiny_data_dir, tiny_model_dir, killed), tmp_path)
    assert "4" in stopped and not (killed / "cross_encoder").exists()
    ckpt = load_file(str(killed / "checkpoints" / "step_4" / "model.safetensors"))
    assert ckpt and all(is_trained_key(k) for k in ckpt)  # adapters and head, no copy of the base
    assert any("classifier.modules_to_save" in k for k in ckpt)
    _run(CLI + _args(tiny_data_dir, tiny_model_dir, killed), tmp_path)
    summary = json.loads((killed / "train_summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["config"]["model"]["lora"]["target_modules"] == ["query",
                                                                                                          "value"]
    a = load_file(str(straight / "cross_encoder" / "encoder" / "adapter_model.safetensors"))
    b = load_file(str(killed / "cross_encoder" / "encoder" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in a.items() if "lora_B" in k)  # it trained
    assert not (killed / "cross_encoder" / "encoder" / "model.safetensors").exists()

    # score and teacher-scores (dpr-rerank's and the pipeline's functions) take it as they take a full cross-encoder
    from dpr.rerank.pipeline import score_training_candidates
    from dpr.rerank.rerank_file import rerank_file
    from dpr.rerank.stage_config import TeacherStageConfig

    results, reranked = _results(tmp_path / "dev.json"), tmp_path / "reranked.json"
    rerank_file(killed / "cross_encoder", results, reranked, k=len(DOCS), precision="fp32")
    model, tok, _ = load_cross_encoder(killed, device="cpu")
    want = _scores(model, tok).view(len(QUESTIONS), -1)
    for rec, row in zip(json.loads(reranked.read_text()), want):
        got = {c["id"]: c["rerank_logit"] for c in rec["ctxs"]}
        assert [got[str(i)] for i in range(len(DOCS))] == pytest.approx(row.tolist(), abs=1e-5)
    tcfg = TeacherStageConfig(max_negatives=2)
    tcfg.rerank.score.precision = "fp32"
    scores = tmp_path / "ts" / "teacher_scores.jsonl"
    manifest = score_training_candidates(killed / "cross_encoder", tiny_data_dir / "tiny" / "train.json", scores, tcfg)
    assert manifest["questions"] == 8 and len(scores.read_text().splitlines()) == 8


def test_the_finished_run_refusal_sees_the_lora_settings(tiny_data_dir, tiny_model_dir, tmp_path):
    from dpr.rerank.train import train_cross_encoder

    train = with_negatives(tiny_data_dir)
    cfg = RerankConfig.from_dict({"model": {"name": str(tiny_model_dir), "lora": {"r": 4, "dropout": 0.0}},
                                  "max_length": 64, "train": {"max_steps": 1, "batch_size": 4, "negatives": 2,
                                                              "save_every": 0, "precision": "fp32"}})
    train_cross_encoder(cfg, train, tmp_path / "run")
    assert train_cross_encoder(cfg, train, tmp_path / "run")["resumed_from_step"] == 0  # the same run: finishes again
    before = (tmp_path / "run" / "train_summary.json").read_bytes()
    cfg.model.lora.r = 8
    with pytest.raises(ValueError, match=r"model.lora.r: 4 -> 8"):
        train_cross_encoder(cfg, train, tmp_path / "run")
    cfg.model.lora = None  # full fine-tuning of the same base: another run too
    with pytest.raises(ValueError, match=r"finished run trained with other settings.*model: \{"):
        train_cross_encoder(cfg, train, tmp_path / "run")
    assert (tmp_path / "run" / "train_summary.json").read_bytes() == before


def test_the_export_of_a_lora_cross_encoder_is_a_merged_copy_with_our_scores(tiny_model_dir, tmp_path):
    from dpr.export.cross_encoder import compare_cross_encoder_export, export_cross_encoder

    model, tok = _lora_model(tiny_model_dir)
    _randomise_trained(model)
    ce = _save(model, tok, tiny_model_dir, tmp_path / "ce")
    out = export_cross_encoder(ce, tmp_path / "export")
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    assert not any("lora" in k or "modules_to_save" in k for k in load_file(str(out / "model.safetensors")))
    assert "merged into the base model's weights" in (out / "README.md").read_text()
    cmp = compare_cross_encoder_export(ce, out, QUESTIONS, DOCS)
    assert cmp["max_abs_diff"] <= 1e-4 and cmp["same_order"] == len(QUESTIONS)  # fp32 both sides
