"""Property tests for the readers DPR's files go through: ``*.qa.csv`` (question, tab, a Python list, written by
Python's csv module) and the streamed top-level JSON list of the biencoder files."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from dpr.data._io import iter_json_array  # noqa: E402
from dpr.data.prepare.dpr_published import convert_qa  # noqa: E402
from dpr.data.qa import read_qa_tsv  # noqa: E402
from dpr.errors import DataError  # noqa: E402

# DPR's questions and answers: any text without tabs or line breaks (its files hold none), quotes and
# backslashes included, with something besides spaces in it
_BREAKS = "\t\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() and the tab split cut on
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=_BREAKS), min_size=1,
                max_size=30).filter(lambda s: s.strip())
_pairs = st.lists(st.tuples(_text, st.lists(_text, min_size=1, max_size=4)), min_size=1, max_size=8)
_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _dpr_qa_csv(pairs) -> bytes:
    out = io.StringIO()
    csv.writer(out, delimiter="\t", lineterminator="\n").writerows([q, str(a)] for q, a in pairs)
    return out.getvalue().encode("utf-8")


@_settings
@given(pairs=_pairs)
def test_qa_csv_as_dpr_writes_it_reads_back(tmp_path_factory, pairs):
    path = tmp_path_factory.mktemp("qa") / "x.qa.csv"
    path.write_bytes(_dpr_qa_csv(pairs))
    got = read_qa_tsv(path)
    assert [(p.question, p.answers) for p in got] == [(q.strip(), a) for q, a in pairs]
    out = path.with_name("test.qa.tsv")
    assert convert_qa(path, out) == len(pairs)  # the prepared copy: answers stripped and de-duplicated
    for p, (q, a) in zip(read_qa_tsv(out), pairs):
        assert p.question == " ".join(q.split())
        assert p.answers == list(dict.fromkeys(x.strip() for x in a if x.strip()))


@_settings
@given(data=st.binary(max_size=200))
def test_qa_csv_garbage_is_a_data_error_or_valid(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("qa") / "x.qa.csv"
    path.write_bytes(data)
    try:
        pairs = read_qa_tsv(path)
    except DataError as err:
        assert str(err).startswith(str(path)) and "\n" not in str(err)
    else:
        assert all(p.question and p.answers for p in pairs)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=20)


@_settings
@given(items=st.lists(_json, max_size=12), indent=st.sampled_from([None, 0, 4]), block=st.integers(1, 64))
def test_streamed_json_list_equals_json_loads(tmp_path_factory, items, indent, block):
    path = tmp_path_factory.mktemp("js") / "a.json"
    path.write_text(json.dumps(items, indent=indent), encoding="utf-8")
    assert [x for _, x in iter_json_array(path, block=block)] == json.loads(path.read_text(encoding="utf-8"))


@_settings
@given(items=st.lists(_json, min_size=1, max_size=6), cut=st.integers(1, 400), block=st.integers(1, 64))
def test_a_cut_json_list_is_a_data_error(tmp_path_factory, items, cut, block):
    text = json.dumps(items)
    if cut >= len(text):
        return
    path = tmp_path_factory.mktemp("js") / "a.json"
    path.write_text(text[:cut], encoding="utf-8")
    with pytest.raises(DataError) as err:
        list(iter_json_array(path, block=block))
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_json_list_errors_name_the_record(tmp_path: Path):
    path = tmp_path / "a.json"
    path.write_text('[{"a": 1},\n {"b": 2} {"c": 3}]')
    with pytest.raises(DataError, match=r"a.json:record 1: expected ',' or ']'"):
        list(iter_json_array(path))
    path.write_bytes(b'[{"a": "\xff"}]')
    with pytest.raises(DataError, match="not UTF-8"):
        list(iter_json_array(path))
    path.write_text('[1] [2]')
    with pytest.raises(DataError, match="after the closing"):
        list(iter_json_array(path))
