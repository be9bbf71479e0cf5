"""A training file read one question at a time (dpr/training/example_file.py): the same examples and batches as
reading it whole, while a rank parses only the records of the batches it builds."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpr.errors import DataError
from dpr.training.batching import load_examples
from dpr.training.example_file import ExampleFile
from tests.training.helpers import train_batches


def _ctx(pid: str) -> dict:
    return {"passage_id": pid, "title": f"T{pid}", "text": f"text of {pid} \u00e9\u4e2d"}


def _examples(n: int, negatives: int = 2) -> list[dict]:
    out = []
    for i in range(n):
        out.append({"question": f"q{i} \u00fc?", "answers": [f"a{i}"], "positive_ctxs": [_ctx(f"p{i // 2}")],
                    "hard_negative_ctxs": [_ctx(f"h{(i + k) % n}") for k in range(negatives)],
                    "negative_ctxs": [_ctx(f"n{i}")]})
    return out


def _write(path, examples, indent=None, bom=False):
    text = json.dumps(examples, indent=indent, ensure_ascii=False)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


@pytest.mark.parametrize("indent,bom", [(None, False), (4, False), (1, True)])
def test_the_same_examples_as_reading_the_file_whole(tmp_path, indent, bom):
    examples = _examples(9) + [{"question": "no positive", "answers": [], "positive_ctxs": []}]
    path = _write(tmp_path / "train.json", examples, indent, bom)
    lazy = ExampleFile(path)
    assert lazy.parsed == 0 and len(lazy) == 9  # the scan keeps no record; the one without a positive is skipped
    assert list(lazy) == load_examples(path) and lazy[-1] == load_examples(path)[-1]


json_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(qs=st.lists(st.tuples(json_text, json_text, st.booleans()), min_size=1, max_size=6),
       indent=st.sampled_from([None, 0, 2]), chunk=st.sampled_from([1, 3, 64, 1 << 16]))
def test_any_text_and_any_layout_read_back(tmp_path, monkeypatch, qs, indent, chunk):
    monkeypatch.setattr("dpr.training.example_file.CHUNK", chunk)  # objects split across reads
    examples = [{"question": q, "answers": [a], "positive_ctxs": [{"passage_id": str(i), "title": a, "text": q or "x"}],
                 **({"negative_ctxs": []} if neg else {})} for i, (q, a, neg) in enumerate(qs)]
    path = _write(tmp_path / "t.json", examples, indent)

    def outcome(read):
        try:
            return list(read(path))
        except DataError as err:  # an empty question: the same refusal, naming the same record and field
            return str(err)

    assert outcome(ExampleFile) == outcome(load_examples)


_OK = '{"question": "a", "answers": [], "positive_ctxs": [{"passage_id": 1, "title": "", "text": "t"}]}'


@pytest.mark.parametrize("text,line", [(f'[{_OK}\n,\n{{"question": ', 3), (f'[\n{_OK} {_OK}]', 2),
                                       ('{"question": 1}', 1), (f'[{_OK},\n\n{_OK}, ]', 3)])
def test_broken_json_is_one_line_naming_the_file_and_line(tmp_path, text, line):
    path = tmp_path / "train.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as err:
        ExampleFile(path)
    assert f"train.json:{line}: " in str(err.value) and "\n" not in str(err.value)


def test_a_bad_field_names_its_record(tmp_path):
    examples = _examples(3)
    examples[2]["positive_ctxs"][0]["text"] = 5
    with pytest.raises(DataError, match="record 2.*positive_ctxs"):
        ExampleFile(_write(tmp_path / "train.json", examples))


@pytest.mark.parametrize("topics,hard", [(False, 3), (True, 1), (False, 6)])
def test_batches_equal_those_of_the_whole_file(tmp_path, topics, hard):
    """Same batches, items (top-ups from the pool included: hard=6 exceeds the mined ones) and masks."""
    path = _write(tmp_path / "train.json", _examples(24), indent=2)
    kw = dict(batch_size=3, hard_negatives=hard, topic_batches=topics, seed=3, world_size=2, rank=1)
    whole, lazy = train_batches(load_examples(path), None, **kw), train_batches(ExampleFile(path), None, **kw)
    for epoch in (0, 1):
        assert whole.global_batches(epoch) == lazy.global_batches(epoch)
        for b in range(whole.num_batches(epoch)):
            assert whole.global_items(epoch, b) == lazy.global_items(epoch, b)


def test_a_rank_parses_only_the_records_of_the_batches_it_builds(tmp_path):
    path = _write(tmp_path / "train.json", _examples(40), indent=2)
    examples = ExampleFile(path)
    batches = train_batches(examples, None, batch_size=2, hard_negatives=1, seed=0, world_size=2, rank=0)
    assert examples.parsed == 0  # batching, de-duplication and the pool need no record
    assert batches.num_batches(0) >= 5 and examples.parsed == 0
    items = batches.items(0, 0)
    assert len(items) == 2 and examples.parsed == 4  # one global batch: 2 ranks x 2 questions, nothing else
    for b in range(1, 5):
        batches.items(0, b)
    assert examples.parsed == 5 * 4  # of 40: the file is never held whole


def test_training_never_reads_the_file_whole(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """A run with the token cache on streams its training file: the whole-file reader is never called for it."""
    from dpr.training.train import train
    from tests.training.test_trainer import tiny_cfg

    train_file = tiny_data_dir / "tiny" / "train.json"
    real = load_examples.__globals__["read_retriever_json"]

    def guarded(path):
        assert str(path) != str(train_file), "the training file was read whole"
        return real(path)

    monkeypatch.setattr("dpr.training.batching.read_retriever_json", guarded)
    summary = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", max_steps=2, save_every=0,
                             precision="fp32", validate=False))
    assert summary["steps"] == 2


def test_records_are_counted_streaming(tmp_path):
    from dpr.training.example_file import count_records

    examples = _examples(7) + [{"question": "no positive", "answers": [], "positive_ctxs": []}]
    assert count_records(_write(tmp_path / "a.json", examples, indent=3)) == 8
    assert count_records(_write(tmp_path / "b.json", [])) == 0
