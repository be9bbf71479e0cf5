"""`EncodeOptions`: one object for the options `encode_texts` and `iter_encode_batches` share. Passing it gives the
same vectors and batches as the same options as keywords; keywords beside it override its fields; an unknown option
is refused by name."""

from __future__ import annotations

import pytest
import torch

from dpr.models import BiEncoderConfig, EncodeOptions, build_biencoder, encode_texts, iter_encode_batches

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["who wrote hamlet", "the cat sat on the mat", "a b", "Water boils at 100 degrees Celsius at sea level."]
TITLES = ["Hamlet", "", "Letters", "Water"]


def _model(tiny_model_dir):
    torch.manual_seed(0)
    return build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="mean"))


def test_options_object_equals_the_same_keywords(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    opts = EncodeOptions(batch_size=3, max_length=8, autocast="off", length_sort="chars")
    by_object = encode_texts(model, tok, TEXTS, "passage", opts, titles=TITLES)
    by_keywords = encode_texts(model, tok, TEXTS, "passage", batch_size=3, max_length=8, autocast="off",
                               length_sort="chars", titles=TITLES)
    assert torch.equal(by_object, by_keywords)
    # the options are used, not ignored: a longer max_length sees more of the long passage
    longer = encode_texts(model, tok, TEXTS, "passage", EncodeOptions(batch_size=3, autocast="off"), titles=TITLES)
    assert not torch.allclose(by_object[3], longer[3], atol=1e-4)
    batches = [idx for idx, _ in iter_encode_batches(model, tok, TEXTS, "passage", opts, titles=TITLES)]
    assert [len(b) for b in batches] == [3, 1]
    assert sorted(i for b in batches for i in b) == list(range(len(TEXTS)))


def test_keywords_override_the_options_object(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    opts = EncodeOptions(batch_size=1, autocast="off", length_sort="none")
    batches = [idx for idx, _ in iter_encode_batches(model, tok, TEXTS, "question", opts, batch_size=2)]
    assert batches == [[0, 1], [2, 3]]
    assert opts.batch_size == 1  # the caller's object is left as it was


def test_bad_options_are_refused(tiny_model_dir):
    model, tok = _model(tiny_model_dir)
    with pytest.raises(TypeError, match=r"unknown encode option\(s\) \['batchsize'\]"):
        encode_texts(model, tok, TEXTS, "question", batchsize=2)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        encode_texts(model, tok, TEXTS, "question", EncodeOptions(batch_size=0))
    with pytest.raises(ValueError, match="length_sort must be one of"):
        list(iter_encode_batches(model, tok, TEXTS, "question", EncodeOptions(length_sort="words")))
