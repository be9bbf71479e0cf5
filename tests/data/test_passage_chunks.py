"""`dpr.data.passage_chunks`: a row range of the passages' Arrow copy, read in chunks with ``read()``, gives exactly
the rows ``ds[a:b]`` gives through the memory map, whatever the record batches, range and chunk size."""

from __future__ import annotations

import tempfile
from pathlib import Path

import datasets
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.data.passage_chunks import iter_chunks, passage_source
from dpr.data.passages import HEADER, load_passages, write_passages

FEATURES = datasets.Features({k: datasets.Value("string") for k in HEADER})


def _arrow_dataset(directory: Path, rows: list[dict], batch_rows: int) -> datasets.Dataset:
    """``rows`` in an Arrow stream file of ``batch_rows``-row record batches, memory-mapped as load_passages'."""
    from datasets.arrow_writer import ArrowWriter

    path = directory / "passages.arrow"
    with ArrowWriter(path=str(path), features=FEATURES, writer_batch_size=batch_rows) as writer:
        for row in rows:
            writer.write(row)
        writer.finalize()
    return datasets.Dataset.from_file(str(path))


def _rows(n: int, texts: list[str]) -> list[dict]:
    return [{"id": f"p{i}", "text": texts[i % len(texts)] + f" {i}", "title": texts[-1 - i % len(texts)]}
            for i in range(n)]


def _chunks(source, start: int, end: int, size: int) -> list[tuple[int, dict]]:
    return list(iter_chunks(source, start, end, size))


def _assert_like_slices(ds: datasets.Dataset, chunks: list[tuple[int, dict]], start: int, end: int, size: int):
    assert [a for a, _ in chunks] == list(range(start, end, size))
    for a, rows in chunks:
        assert rows == ds[a:min(a + size, end)]  # the same columns, values and order as through the map


@settings(max_examples=40)
@given(n=st.integers(0, 60), batch_rows=st.integers(1, 17), size=st.integers(1, 25), data=st.data(),
       texts=st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
                      min_size=1, max_size=5))
def test_chunks_read_from_the_file_are_the_slices_of_the_dataset(n, batch_rows, size, data, texts):
    start = data.draw(st.integers(0, n), label="start")
    end = data.draw(st.integers(start, n), label="end")
    with tempfile.TemporaryDirectory() as tmp:
        ds = _arrow_dataset(Path(tmp), _rows(n, texts), batch_rows)
        source = passage_source(ds)
        assert len(source.arrow_files) == 1 and source.dataset is None and source.rows == n
        _assert_like_slices(ds, _chunks(source, start, end, size), start, end, size)


def test_load_passages_is_read_from_its_arrow_file(tmp_path):
    rows = [(f"id{i}", f"text é {i}", f"title {i % 3}" if i % 2 else "") for i in range(2500)]
    write_passages(tmp_path / "p.tsv", rows)
    ds = load_passages(tmp_path / "p.tsv", cache_dir=tmp_path / "cache")
    source = passage_source(ds)
    assert source.arrow_files == (Path(ds.cache_files[0]["filename"]),) and source.rows == 2500
    chunks = _chunks(source, 700, 2500, 512)
    _assert_like_slices(ds, chunks, 700, 2500, 512)
    assert [r for _, c in chunks for r in c["id"]] == [f"id{i}" for i in range(700, 2500)]


def test_a_corpus_past_the_shard_size_is_read_from_its_files_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "MAX_SHARD_SIZE", "20KB")  # datasets' 500MB, ~1M passages, made small
    write_passages(tmp_path / "p.tsv", [(f"id{i}", f"text {i} " * 5, "") for i in range(3000)])
    ds = load_passages(tmp_path / "p.tsv", cache_dir=tmp_path / "cache")
    source = passage_source(ds)
    assert len(source.arrow_files) > 1 and source.arrow_files == tuple(Path(f["filename"]) for f in ds.cache_files)
    _assert_like_slices(ds, _chunks(source, 10, 2990, 700), 10, 2990, 700)


@pytest.mark.parametrize("derive", [lambda ds: ds.select(range(3, 40)),  # an index mapping on top of the file
                                    lambda ds: ds.map(lambda r: {"text": r["text"].upper()}, keep_in_memory=True),
                                    lambda ds: datasets.Dataset.from_dict(ds[:], features=FEATURES),  # in memory
                                    lambda ds: datasets.concatenate_datasets([ds, ds.select(range(4))])])
def test_a_dataset_that_is_not_plain_files_is_read_through_the_dataset(tmp_path, derive):
    ds = derive(_arrow_dataset(tmp_path, _rows(50, ["a", "b"]), 7))
    source = passage_source(ds)
    assert source.arrow_files == () and source.dataset is ds
    _assert_like_slices(ds, _chunks(source, 2, len(ds), 6), 2, len(ds), 6)


def test_a_range_outside_the_passages_or_a_bad_chunk_size_is_refused(tmp_path):
    source = passage_source(_arrow_dataset(tmp_path, _rows(10, ["a"]), 4))
    with pytest.raises(ValueError, match=r"rows \[5, 11\) are not within the 10 passages"):
        _chunks(source, 5, 11, 3)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        _chunks(source, 0, 10, 0)


def test_an_arrow_file_shorter_than_its_dataset_says_is_an_error_not_missing_rows(tmp_path):
    source = passage_source(_arrow_dataset(tmp_path, _rows(10, ["a"]), 4))
    short = type(source)(12, source.arrow_files)  # a dataset of 12 rows over a file of 10
    with pytest.raises(ValueError, match="hold 10 rows, fewer than 12"):
        _chunks(short, 0, 12, 5)
