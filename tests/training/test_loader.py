"""The background loader and the token cache feed the trainer exactly the batches the inline path builds."""

from __future__ import annotations

import threading

import pytest
import torch

from dpr.models import load_biencoder
from dpr.training.batching import load_examples
from dpr.training.loader import Prefetcher, batch_stream
from dpr.training.train_tokens import train_tokens
from tests.conftest import add_tiny_hard_negatives
from tests.training.helpers import train_batches


def _same(a, b) -> None:
    assert a.index == b.index and a.questions == b.questions
    for x, y in ((a.q_inputs, b.q_inputs), (a.p_inputs, b.p_inputs)):
        assert (x is None) == (y is None)
        if x is not None:
            assert list(x) == list(y) and all(torch.equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in x)
    assert torch.equal(a.masks.positive, b.masks.positive) and torch.equal(a.masks.ignore, b.masks.ignore)


@pytest.fixture
def setup(tiny_model_dir, tiny_data_dir):
    add_tiny_hard_negatives(tiny_data_dir / "tiny", per_question=2)
    train_file = tiny_data_dir / "tiny" / "train.json"
    examples = load_examples(train_file)
    examples[0]["positive_ctxs"][0]["title"] = ""  # a batch mixing passages with and without a title
    model, tok = load_biencoder(str(tiny_model_dir), question_max_length=12, passage_max_length=20,
                                question_prefix="q: ", passage_prefix="p: ")
    kw = dict(batch_size=3, hard_negatives=3, seed=5, question_max_length=12, passage_max_length=20,
              question_prefix="q: ", passage_prefix="p: ", mask_answers=True)
    tokens = train_tokens(examples, tok, train_file, question_max_length=12, passage_max_length=20,
                          question_prefix="q: ", passage_prefix="p: ")
    return examples, tok, kw, tokens


@pytest.mark.parametrize("passages", [True, False])
def test_loader_and_token_cache_give_the_inline_batches(setup, passages):
    examples, tok, kw, tokens = setup
    inline = train_batches(examples, tok, **kw)  # tokenised per batch, on this thread: the path before both
    cached = train_batches(examples, tok, tokens=tokens, **kw)
    for epoch in range(2):
        want = list(inline.iter_epoch(epoch, passages=passages))
        assert len(want) == inline.num_batches(epoch) >= 2
        for start in (0, 1):  # resume mid-epoch: the same batches from there
            for got in (list(cached.iter_epoch(epoch, start, passages=passages)),
                        list(batch_stream(cached, epoch, start, passages, background=True, device=torch.device("cpu"))),
                        list(batch_stream(inline, epoch, start, passages, background=True,
                                          device=torch.device("cpu")))):
                assert len(got) == len(want) - start
                for a, b in zip(want[start:], got):
                    _same(a, b)
    # the token ids were read from the tables (no tokenizer call): a tokenizer that fails proves it
    cached.tokenizer = None
    _same(want[0], next(cached.iter_epoch(1, passages=passages)))


def test_batches_built_in_the_thread_tokenise_with_their_own_tokenizer(setup):
    examples, tok, kw, _ = setup
    inline = train_batches(examples, tok, **kw)
    seen = []
    original = inline._tokenizer_here

    def spy():
        seen.append((threading.current_thread() is threading.main_thread(), original()))
        return seen[-1][1]
    inline._tokenizer_here = spy
    list(batch_stream(inline, 0, 0, True, background=True, device=torch.device("cpu")))
    assert seen and all(not main and t is not tok for main, t in seen)  # a copy: never the one the trainer uses


def test_prefetcher_raises_where_the_source_failed_and_stops_when_closed():
    def source():
        yield 1
        yield 2
        raise RuntimeError("bad batch")
    it = Prefetcher(source, depth=1)
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(RuntimeError, match="bad batch"):
        next(it)
    endless = Prefetcher(lambda: iter(range(10**9)), depth=2)
    assert next(endless) == 0
    endless.close()
    assert not endless._thread.is_alive()
