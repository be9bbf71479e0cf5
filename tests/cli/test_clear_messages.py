"""Messages that say what is wrong: a model whose float32 vectors are NaN was told to "use
dtype=float32", the dtype it was already using."""

from __future__ import annotations

from tests.run_command import run_command


def test_a_corrupt_model_is_not_told_to_use_the_dtype_it_uses(tmp_path, tiny_model_dir, tiny_data_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.fill_(float("nan"))  # a corrupted (or diverged) model
    bad = tmp_path / "nan_model"
    model.save_pretrained(bad)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(bad)
    for dtype in ("float32", "float16"):
        proc = run_command(["dpr-encode", f"model={bad}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                            f"output_dir={tmp_path / dtype}", f"dtype={dtype}"])
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-encode")]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
        assert f"the model {bad} produces non-finite (NaN/inf) passage vectors" in lines[0], lines[0]
        assert "use dtype=float32" not in lines[0] and "corrupt or diverged" in lines[0]
