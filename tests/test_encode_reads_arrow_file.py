"""`dpr-encode` reads the passages' Arrow copy with ``read()`` (`dpr.data.passage_chunks`), not through the memory
map of the dataset, and writes the same shard files as the read through the dataset did."""

from __future__ import annotations

import datasets
import pytest

from dpr.data import passage_chunks
from tests.encode_kw import encode_corpus

KW = dict(dtype="float32", batch_size=4, chunk_size=3, device="cpu", autocast="off", progress=False)


def _files(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix != ".json"}


@pytest.mark.parametrize("num_shards", [1, 3])
def test_the_shards_read_from_the_file_are_the_shards_read_through_the_dataset(tiny_model_dir, tiny_data_dir,
                                                                                 tmp_path, monkeypatch, num_shards):
    psg, cache = tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "cache"
    real_source = passage_chunks.passage_source
    monkeypatch.setattr(passage_chunks, "passage_source",  # the dataset's own slices, ds[a:b]
                        lambda ds: passage_chunks.PassageSource(len(ds), None, ds))
    encode_corpus(tiny_model_dir, psg, tmp_path / "through_dataset", num_shards=num_shards, cache_dir=cache, **KW)
    monkeypatch.setattr(passage_chunks, "passage_source", real_source)

    def no_map(self, key):
        raise AssertionError("a passage was read through the memory-mapped dataset")

    monkeypatch.setattr(datasets.Dataset, "__getitem__", no_map)
    encode_corpus(tiny_model_dir, psg, tmp_path / "from_file", num_shards=num_shards, cache_dir=cache, **KW)
    got, want = _files(tmp_path / "from_file"), _files(tmp_path / "through_dataset")
    assert len(got) == 2 * num_shards and got == want  # every .npy and .ids.txt, byte for byte
