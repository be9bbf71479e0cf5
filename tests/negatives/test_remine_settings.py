"""`remine_dataset` takes the re-mining settings whole (`RemineConfig`): the same mined file as the keywords of
`RemineConfig.as_kwargs` (what the pipeline passes), keywords overriding the object, an unknown key refused."""

from __future__ import annotations

import json

import pytest

from dpr.data.dataset import DatasetPaths
from dpr.negatives.config import RemineConfig
from dpr.negatives.dense import remine_dataset

from tests.run_command import run_command


@pytest.fixture(scope="module")
def mined_from(tiny_model_dir, tmp_path_factory):
    """The tiny dataset and an index of its passages encoded by the tiny model."""
    from tests.conftest import write_tiny_dataset

    root = tmp_path_factory.mktemp("remine")
    data = write_tiny_dataset(root / "data" / "tiny")
    emb, index = root / "emb", root / "idx" / "index.faiss"
    enc = run_command(["dpr-encode", f"model={tiny_model_dir}", f"passages={data / 'passages.tsv'}",
                       f"output_dir={emb}", "num_shards=1", "dtype=float32", "autocast=off"], cwd=root)
    assert enc.returncode == 0, enc.stderr
    idx = run_command(["dpr-index", f"embeddings={emb}", f"output={index}", "index=flat"], cwd=root)
    assert idx.returncode == 0, idx.stderr
    return DatasetPaths(data), index


def test_config_object_equals_the_pipeline_keywords(mined_from, tiny_model_dir, tmp_path):
    ds, index = mined_from
    config = RemineConfig(negatives=3, depth=6, skip_top=1, relative_margin=0.0, bm25_share=0.0)
    by_object = remine_dataset(tiny_model_dir, index, ds, tmp_path / "a.json", config=config)
    by_keywords = remine_dataset(tiny_model_dir, index, ds, tmp_path / "b.json", **config.as_kwargs())
    assert by_object == by_keywords
    assert by_object["questions"] > 0 and 0 < by_object["kept"] <= 3 * by_object["questions"]
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert a == b
    assert all(len(ex["hard_negative_ctxs"]) <= 3 for ex in a)
    # the settings are used: a wider list keeps more
    wider = remine_dataset(tiny_model_dir, index, ds, tmp_path / "c.json", config=config, num_negatives=5)
    assert wider["kept"] > by_object["kept"]


def test_unknown_setting_is_refused(mined_from, tiny_model_dir, tmp_path):
    ds, index = mined_from
    with pytest.raises(TypeError, match="negativez"):
        remine_dataset(tiny_model_dir, index, ds, tmp_path / "x.json", negativez=3)
    assert not (tmp_path / "x.json").exists()
