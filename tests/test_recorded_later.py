"""The value a key had before runs recorded it is declared on its dataclass field (`dpr.config.setting` /
`ranged`'s ``recorded_before``), and every recorded form is derived from those declarations: what biencoder.json
writes, what runs and pipeline stages compare for ``model`` and ``train``, and how shard manifests without a key
read. The forms must stay exactly what they were when these facts sat in hand-kept tables (the literals below),
or recorded runs would re-run and finished shards would be refused."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from dpr.config import recorded_later, setting, without_recorded_later
from dpr.encode_config import EncodeConfig
from dpr.index import shard_manifest, shards
from dpr.models.biencoder import BiEncoderConfig, without_empty_prefixes, without_unset_backbone_keys
from dpr.training.config import NOT_FINGERPRINTED, TrainConfig, without_unset

PACKAGE = Path(__file__).resolve().parents[1] / "dpr"

# The tables as they were kept by hand (dpr/models/biencoder.py, dpr/training/config.py, dpr/index/shard_manifest.py,
# dpr/index/shards.py): the derived ones must mean exactly the same.
OLD_LATER_KEY_DEFAULTS = {"question_prefix": "", "passage_prefix": "", "dtype": "fp32",
                          "gradient_checkpointing": False, "padding_side": "auto", "lora": None}
OLD_BACKBONE_KEYS = ("dtype", "gradient_checkpointing", "padding_side", "lora")
OLD_RECORDED_WHEN_SET = frozenset({"attention_dropout", "matryoshka_dims", "matryoshka_weights",
                                   "matryoshka_distill", "projection_init", "other_negatives", "corpus_sample"})
OLD_RECORDED_LATER = {"runtime": "torch", "weights": "fp32", "compile": False, "truncate_dim": None}
OLD_UNRECORDED = {"weights": "fp32", "compile": False}


def test_the_model_keys_recorded_later_are_the_old_table():
    assert recorded_later(BiEncoderConfig) == OLD_LATER_KEY_DEFAULTS
    # biencoder.json always wrote the prefixes: only the backbone keys are left out of it at their old values
    assert recorded_later(BiEncoderConfig, saved=True) == {k: OLD_LATER_KEY_DEFAULTS[k] for k in OLD_BACKBONE_KEYS}


def test_the_train_keys_recorded_when_set_are_the_old_table():
    later = recorded_later(TrainConfig)
    assert set(later) == OLD_RECORDED_WHEN_SET
    assert all(v is None for v in later.values())  # recorded only when set: null is what runs before them had


def test_the_shard_manifest_keys_recorded_later_are_the_old_tables():
    assert shard_manifest._RECORDED_LATER == OLD_RECORDED_LATER
    assert shard_manifest._SETTING_NAMES == {"truncate_dim": "dim"}
    # shards.list_shards reads a missing key of AGREED_KEYS as before
    assert ({k: shards._UNRECORDED.get(k) for k in shards.AGREED_KEYS}
            == {k: OLD_UNRECORDED.get(k) for k in shards.AGREED_KEYS})


def test_no_hand_kept_table_of_keys_recorded_later():
    pattern = re.compile(r"^(LATER_KEY_DEFAULTS|RECORDED_WHEN_SET|_RECORDED_LATER|_UNRECORDED|_BACKBONE_KEYS)\s*"
                         r"(:[^=]*)?=\s*(frozenset\(|\{|\(|\[)")
    tables = [f"{p.relative_to(PACKAGE.parent)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
              for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.match(line)]
    assert tables == []


# ------------------------------------------------------------------ the recorded forms, as the old tables made them
def _old_compared(model: dict) -> dict:
    return {k: v for k, v in model.items()
            if not (k in OLD_LATER_KEY_DEFAULTS and v == OLD_LATER_KEY_DEFAULTS[k])}


def _old_saved(model: dict) -> dict:
    return {k: v for k, v in model.items() if not (k in OLD_BACKBONE_KEYS and v == OLD_LATER_KEY_DEFAULTS[k])}


def _old_train(train: dict) -> dict:
    out = {k: v for k, v in train.items()
           if not (k in OLD_RECORDED_WHEN_SET and v is None) and k not in NOT_FINGERPRINTED}
    if out.get("length_bucket_size") == "auto":
        out["length_bucket_size"] = 8  # on the CPU
    return out


MODEL_LATER = {"question_prefix": "query: ", "passage_prefix": "passage: ", "dtype": "bf16",
               "gradient_checkpointing": True, "padding_side": "left", "lora": {"r": 8, "alpha": 16}}
TRAIN_LATER = {"attention_dropout": 0.0, "matryoshka_dims": [32, 16], "matryoshka_weights": [1.0, 0.5],
               "matryoshka_distill": 0.5, "projection_init": "pca", "other_negatives": False, "corpus_sample": 1000}


def _model_variants():
    yield {}
    for k, v in MODEL_LATER.items():
        yield {k: v}
    yield dict(MODEL_LATER)
    yield dict(OLD_LATER_KEY_DEFAULTS)  # each later key set, at its old value
    yield {"projection_dim": 128, "similarity": "cosine", "shared": True}


def _train_variants():
    yield {}
    for k, v in TRAIN_LATER.items():
        yield {k: v}
    yield {"other_negatives": True}
    yield {k: None for k in TRAIN_LATER}
    yield {"lr": 3e-5, "length_bucket_size": 0}


def _forms() -> dict[str, list]:
    out: dict[str, list] = {"model_json": [], "model_compared": [], "train": []}
    for over in _model_variants():
        cfg = BiEncoderConfig(**over)
        out["model_json"].append(cfg.to_dict())
        out["model_compared"].append(without_empty_prefixes(dataclasses.asdict(cfg)))
    for over in _train_variants():
        out["train"].append(without_unset(dataclasses.asdict(TrainConfig(**over)), "cpu"))
    return out


# sha256 of each list of forms above, computed by the code that kept the tables by hand (before they moved onto the
# fields): byte-identical JSON, so every recorded run and stage compares as it did
RECORDED_FORMS = {
    "model_json": "15b299c3775b36b81ee601337e995c2178aa99bb90f20fc0f37dc1c9bba8f819",
    "model_compared": "cfaa1a87b2ae5592a0342480c5a1f8e0e299030e26f5568075b37e27b236dcb4",
    "train": "f88aefc33d10c7d572efb8fe52abfd12d79e969670e946beed846ee629b239e7",
}


def test_the_recorded_forms_are_byte_identical_to_the_old_code():
    got = {k: hashlib.sha256(json.dumps(v).encode()).hexdigest() for k, v in _forms().items()}
    assert got == RECORDED_FORMS


def test_each_form_equals_the_old_tables_form():
    forms = _forms()
    models = [dataclasses.asdict(BiEncoderConfig(**over)) for over in _model_variants()]
    assert forms["model_json"] == [_old_saved(m) for m in models]
    assert forms["model_compared"] == [_old_compared(m) for m in models]
    trains = [dataclasses.asdict(TrainConfig(**over)) for over in _train_variants()]
    assert forms["train"] == [_old_train(t) for t in trains]


_model_values = st.fixed_dictionaries({}, optional={
    "question_prefix": st.sampled_from(["", "query: "]), "passage_prefix": st.sampled_from(["", "passage: "]),
    "dtype": st.sampled_from(["fp32", "bf16"]), "gradient_checkpointing": st.booleans(),
    "padding_side": st.sampled_from(["auto", "left", "right"]), "lora": st.sampled_from([None, {"r": 4}]),
    "pooling": st.sampled_from(["cls", "mean"]), "projection_dim": st.sampled_from([None, 16])})


@settings(max_examples=60, deadline=None)
@given(_model_values)
def test_any_model_config_records_as_before(over):
    model = dataclasses.asdict(BiEncoderConfig(**over))
    assert without_empty_prefixes(model) == _old_compared(model)
    assert without_unset_backbone_keys(model) == _old_saved(model)
    assert json.dumps(BiEncoderConfig(**over).to_dict()) == json.dumps(_old_saved(model))


_train_values = st.fixed_dictionaries({}, optional={
    "attention_dropout": st.sampled_from([None, 0.0, 0.1]), "other_negatives": st.sampled_from([None, True, False]),
    "corpus_sample": st.sampled_from([None, 1, 500]), "projection_init": st.sampled_from([None, "pca"]),
    "background_loader": st.sampled_from([None, False]), "token_cache": st.sampled_from([None, True]),
    "length_bucket_size": st.sampled_from(["auto", 0, 4])})


@settings(max_examples=60, deadline=None)
@given(_train_values)
def test_any_train_config_records_as_before(over):
    train = dataclasses.asdict(TrainConfig(**over))
    assert json.dumps(without_unset(train, "cpu")) == json.dumps(_old_train(train))


# ------------------------------------------------------------------ the declaration itself
def test_recorded_later_reads_the_declarations():
    @dataclasses.dataclass
    class Demo:
        old: int = 1
        added: str = setting("new", recorded_before="old")
        renamed: int | None = setting(None, recorded_before=None, recorded_as="stored_name")
        always: str = setting("", recorded_before="", saved_always=True)

    assert recorded_later(Demo) == {"added": "old", "stored_name": None, "always": ""}
    assert recorded_later(Demo(), saved=True) == {"added": "old", "stored_name": None}
    record = {"old": 1, "added": "old", "stored_name": None, "always": ""}
    assert without_recorded_later(record, recorded_later(Demo)) == {"old": 1}
    assert without_recorded_later({"added": "new", "always": "x"}, recorded_later(Demo)) == {"added": "new",
                                                                                             "always": "x"}


def test_recorded_as_needs_a_recorded_before_value():
    with pytest.raises(TypeError, match="recorded_before"):
        setting(None, recorded_as="other")
    with pytest.raises(TypeError, match="recorded_before"):
        setting("", saved_always=True)


def test_an_encode_setting_is_recorded_under_its_manifest_name():
    assert recorded_later(EncodeConfig) == OLD_RECORDED_LATER


def test_the_reference_page_notes_what_records_made_before_a_key_read_as():
    page = (PACKAGE.parent / "docs" / "reference.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    assert "records made before this key existed read as `'fp32'`." in rows["model.dtype"]
    assert "read as `null` (recorded as `truncate_dim`)" in rows["encode.dim"]
    assert "records made before" not in rows["model.pooling"]
