"""Model prefixes (``model.question_prefix`` / ``passage_prefix``, e5's "query: " / "passage: "): the same text
reaches the towers in training, validation, export and retrieval, and a trained run keeps its prefixes."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.models.inference import tokenize_batch, with_prefix

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["what is the capital of france", "which is the largest ocean"]
PASSAGES = ["Paris is the capital of France.", "The Pacific Ocean is the largest.", "Berlin is in Germany."]
TITLES = ["Paris", "", "Berlin"]  # one passage without a title: its text takes the prefix


def test_the_prefix_goes_before_the_first_segment():
    assert with_prefix(["a", "b"], None, "query: ") == (["query: a", "query: b"], None)
    assert with_prefix(["a", "b"], ["T", ""], "p: ") == (["a", "p: b"], ["p: T", ""])
    assert with_prefix(["a"], ["T"], "") == (["a"], ["T"])


@settings(max_examples=30, deadline=None)
@given(texts=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=5), prefix=st.text(max_size=8),
       data=st.data())
def test_with_prefix_keeps_every_input_and_prefixes_each_once(texts, prefix, data):
    titles = data.draw(st.none() | st.lists(st.sampled_from(["", "T", "Title"]), min_size=len(texts), max_size=len(texts)))
    new_texts, new_titles = with_prefix(texts, titles, prefix)
    assert len(new_texts) == len(texts) and (new_titles is None) == (titles is None)
    for i, text in enumerate(texts):
        first = new_titles[i] if titles and titles[i] else new_texts[i]
        rest = new_texts[i] if titles and titles[i] else None
        assert first == prefix + (titles[i] if titles and titles[i] else text)
        assert rest in (None, text)


def _model(tiny_model_dir, **prefixes):
    from dpr.models import BiEncoderConfig, build_biencoder

    torch.manual_seed(0)
    return build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="mean", similarity="cosine",
                                           passage_max_length=48, **prefixes))


def test_encoding_applies_the_models_prefixes(tiny_model_dir):
    from dpr.models import encode_texts

    plain, tok = _model(tiny_model_dir)
    prefixed, _ = _model(tiny_model_dir, question_prefix="query: ", passage_prefix="passage: ")
    prefixed.load_state_dict(plain.state_dict())  # the same weights: only the prefixes differ
    q = encode_texts(prefixed, tok, QUESTIONS, "question", autocast="off")
    p = encode_texts(prefixed, tok, PASSAGES, "passage", titles=TITLES, autocast="off")
    by_hand_q = encode_texts(plain, tok, ["query: " + x for x in QUESTIONS], "question", autocast="off")
    texts, titles = with_prefix(PASSAGES, TITLES, "passage: ")
    by_hand_p = encode_texts(plain, tok, texts, "passage", titles=titles, autocast="off")
    assert torch.allclose(q, by_hand_q, atol=1e-6) and torch.allclose(p, by_hand_p, atol=1e-6)
    assert not torch.allclose(q, encode_texts(plain, tok, QUESTIONS, "question", autocast="off"), atol=1e-4)


def test_training_batches_carry_the_prefixes(tiny_model_dir, tiny_data_dir):
    from dpr.models import load_biencoder
    from dpr.training.batching import load_examples
    from tests.training.helpers import train_batches

    _, tok = load_biencoder(str(tiny_model_dir))
    examples = load_examples(tiny_data_dir / "tiny" / "train.json")
    kw = dict(batch_size=4, hard_negatives=1, question_max_length=32, passage_max_length=64, seed=3)
    plain = next(train_batches(examples, tok, **kw).iter_epoch(0))
    prefixed = next(train_batches(examples, tok, question_prefix="query: ", passage_prefix="passage: ", **kw).iter_epoch(0))
    items = train_batches(examples, tok, **kw).items(0, 0)
    want_q = tokenize_batch(tok, ["query: " + it.question for it in items], None, 32)
    ctxs = [c for it in items for c in it.passages]
    texts, titles = with_prefix([c["text"] for c in ctxs], [c.get("title") or "" for c in ctxs], "passage: ")
    want_p = tokenize_batch(tok, texts, titles, 64)
    got_q, got_p = prefixed[1], prefixed[2]
    assert torch.equal(got_q["input_ids"], want_q["input_ids"]) and torch.equal(got_p["input_ids"], want_p["input_ids"])
    assert got_q["input_ids"].shape[1] > plain[1]["input_ids"].shape[1]  # the plain batch has no prefix tokens


def test_a_trained_run_keeps_its_prefixes(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.models import load_biencoder
    from dpr.training.train import train

    cfg = {"model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32,
                     "passage_max_length": 64, "question_prefix": "query: ", "passage_prefix": "passage: "},
           "data": {"name": "tiny", "kind": "qa"},
           "train": {"batch_size": 4, "hard_negatives": 1, "max_steps": 1, "lr": 1e-3, "validate": False},
           "logger": {"type": "none"}, "data_dir": str(tiny_data_dir), "output_dir": str(tmp_path / "run"), "seed": 7}
    train(cfg)
    saved = json.loads((tmp_path / "run" / "biencoder.json").read_text())["config"]
    assert (saved["question_prefix"], saved["passage_prefix"]) == ("query: ", "passage: ")
    model, _ = load_biencoder(tmp_path / "run")
    assert model.config.prefix("question") == "query: " and model.config.prefix("passage") == "passage: "
    with pytest.raises(ValueError, match="question_prefix"):
        load_biencoder(tmp_path / "run", question_prefix="")


@pytest.mark.parametrize("value", [None, 3])
def test_a_prefix_must_be_a_string(value):
    from dpr.models import BiEncoderConfig

    with pytest.raises(ValueError, match="model.passage_prefix must be a string"):
        BiEncoderConfig(passage_prefix=value)


@pytest.mark.parametrize("name", sorted(p.stem for p in (__import__("pathlib").Path(__file__).resolve().parents[2]
                                                          / "conf" / "model").glob("*.yaml")))
def test_every_model_config_passes_the_schema(name):
    """Each model preset (e5 and bge with their prefixes among them) is a valid ``BiEncoderConfig``, typed by
    the train command's schema (their weights need the hub, so nothing is loaded)."""
    from hydra import compose, initialize_config_dir

    from dpr.cli.common import CONF_DIR
    from dpr.cli.schemas import SCHEMAS, check_config
    from dpr.models import BiEncoderConfig
    from dpr.training.config import register_schema

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        # the name of tiny, llama and qwen2 is required (???): a local directory or hub name the user gives
        cfg = compose(config_name="train", overrides=[f"model={name}", "data=squad1_open"]
                      + (["model.name=/some/dir"] if name in ("tiny", "llama", "qwen2") else []))
    check_config(cfg, SCHEMAS["train"])
    model = BiEncoderConfig.from_dict(cfg.model)
    if name == "e5_small":
        assert (model.question_prefix, model.passage_prefix) == ("query: ", "passage: ")


def test_runs_and_stages_made_before_the_prefix_keys_stay_up_to_date(tmp_path):
    """The presets now spell out empty prefixes; a finished run whose recorded config has no such keys is the
    same run, while a real prefix is a change of settings."""
    from dpr.run_dir import prepare_run_dir

    old = {"model": {"name": "m", "pooling": "mean"}, "data": {"name": "d"}, "train": {"lr": 1.0}, "seed": 1}
    (tmp_path / "train_summary.json").write_text(json.dumps({"config": old}))
    now = {**old, "model": {**old["model"], "question_prefix": "", "passage_prefix": ""}}
    assert prepare_run_dir(tmp_path, now) == "same"
    with pytest.raises(ValueError, match="question_prefix: None -> 'query: '"):
        prepare_run_dir(tmp_path, {**now, "model": {**now["model"], "question_prefix": "query: "}})
