"""scripts/mine_negatives.py: a training file's negatives from BM25, a dense model or their hybrid, through the
one false-negative filter, written beside the dataset rather than over it."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.scripts import script


def _negative_ids(path):
    return [[c["passage_id"] for c in ex["hard_negative_ctxs"]] for ex in json.loads(path.read_text())]


def test_bm25_miner_equals_dpr_bm25_mining(tiny_data_dir, tmp_path):
    from dpr import bm25
    from dpr.data.dataset import DatasetPaths
    from dpr.negatives.bm25 import mine_dataset

    ours, theirs = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    for root in (ours, theirs):
        shutil.copytree(tiny_data_dir / "tiny", root)
    before = (ours / "train.json").read_text()
    out = tmp_path / "mined" / "bm25_train.json"
    script("mine_negatives").main(["--dataset", str(ours), "--miner", "bm25", "--num-negatives", "3", "--depth", "8",
                    "--output", str(out)])
    assert (ours / "train.json").read_text() == before  # the dataset's own file is left alone
    index = bm25.get_or_build_index(theirs / "passages.tsv", theirs / "bm25_index")
    mine_dataset(index, DatasetPaths(theirs), num_negatives=3, depth=8)
    got, want = _negative_ids(out), _negative_ids(theirs / "train.json")
    assert got == want and sum(map(len, got)) > 0
    stats = json.loads((out.parent / "bm25_train.stats.json").read_text())
    assert stats["miner"] == "bm25" and stats["counts"]["kept"] == sum(map(len, got))


def test_hybrid_miner_takes_the_hybrid_order_less_positives_and_answers(tiny_model_dir, tiny_data_dir, tmp_path):
    from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig
    from dpr.index import build_and_save
    from dpr.retrieval.retriever import Retriever

    root = tiny_data_dir / "tiny"
    encode_corpus(tiny_model_dir, root / "passages.tsv", tmp_path / "emb", batch_size=4, dtype="float32",
                  progress=False)
    build_and_save(tmp_path / "emb", tmp_path / "index.faiss", factory="Flat", metric="ip")
    # the pipeline's weight.json: its weight is used with the normalisation it was tuned under
    (tmp_path / "weight.json").write_text(json.dumps({"weight": 0.5, "normalize": "none"}))
    out = tmp_path / "hybrid_train.json"
    script("mine_negatives").main(["--dataset", str(root), "--miner", "hybrid", "--model", str(tiny_model_dir),
                    "--index", str(tmp_path / "index.faiss"), "--weight", str(tmp_path / "weight.json"),
                    "--num-negatives", "3", "--depth", "8", "--output", str(out)])
    hybrid = Retriever.hybrid(Retriever.bm25(root / "passages.tsv", root / "bm25_index"),
                              Retriever.dense(tiny_model_dir, tmp_path / "index.faiss", root / "passages.tsv"),
                              weight=0.5, normalize="none", depth=8)
    examples = json.loads((root / "train.json").read_text())
    ranked = hybrid.search([ex["question"] for ex in examples], k=8)
    for ex, hits, got in zip(examples, ranked, _negative_ids(out)):
        positive = ex["positive_ctxs"][0]["passage_id"]
        # the hybrid's order, without the positive and any passage (text or title) holding an answer
        want = [h.id for h in hits if h.id != positive and not any(
            a.lower() in f"{h.title} {h.text}".lower() for a in ex["answers"])][:3]
        assert got == want, ex["question"]
    stats = json.loads((tmp_path / "hybrid_train.stats.json").read_text())
    assert (stats["weight"], stats["normalize"]) == (0.5, "none")


def test_dense_miners_need_a_model_and_nothing_is_written(tiny_data_dir, tmp_path, capsys):
    out = tmp_path / "x.json"

    class refused:  # one line on stderr, exit 2 (bad input, as the commands do)
        def __init__(self, match):
            self.match, self.raises = match, pytest.raises(SystemExit)

        def __enter__(self):
            self.info = self.raises.__enter__()

        def __exit__(self, *exc):
            handled = self.raises.__exit__(*exc)
            err = capsys.readouterr().err
            assert self.info.value.code == 2 and err.count("\n") == 1 and re.search(self.match, err), err
            return handled

    with refused("needs --model and --index"):
        script("mine_negatives").main(["--dataset", str(tiny_data_dir / "tiny"), "--miner", "hybrid", "--output", str(out)])
    with refused("no such file"):
        script("mine_negatives").main(["--dataset", str(tiny_data_dir / "tiny"), "--split", "nope", "--miner", "bm25",
                        "--output", str(out)])
    (tmp_path / "w.json").write_text("{}")
    with refused("no numeric 'weight' field"):
        script("mine_negatives").main(["--dataset", str(tiny_data_dir / "tiny"), "--miner", "hybrid", "--model", "m", "--index", "i",
                        "--weight", str(tmp_path / "w.json"), "--output", str(out)])
    (tmp_path / "w.json").write_text(json.dumps({"weight": 1.0, "normalize": "zscore"}))
    with refused("field 'normalize' must be one of"):
        script("mine_negatives").main(["--dataset", str(tiny_data_dir / "tiny"), "--miner", "hybrid", "--model", "m", "--index", "i",
                        "--weight", str(tmp_path / "w.json"), "--output", str(out)])
    with refused("--depth: expected a whole number >= 1"):
        script("mine_negatives").main(["--dataset", str(tiny_data_dir / "tiny"), "--miner", "bm25", "--depth", "0",
                        "--output", str(out)])
    assert not out.exists()
