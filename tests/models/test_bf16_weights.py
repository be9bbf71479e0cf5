"""The bf16-weights lever (`dpr.models.weights`): its quality check against bf16 autocast, and dpr-encode's
bookkeeping (manifests record the setting; a resume with another one is refused)."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch

from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig
from dpr.errors import DataError
from dpr.index.shards import ShardFiles, list_shards
from dpr.models import encode_texts, load_biencoder
from dpr.models.weights import cast_weights, inference_autocast, resolve_weights

WORDS = ("capital city river mountain ocean island energy cell plant light water heat north south king war "
         "music paint atom star moon sun law bank train ship book song film game school doctor").split()


def random_texts(n: int, seed: int, lo: int = 4, hi: int = 30) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def _both_paths(model, tok, passages, queries):
    """(autocast bf16 vectors, bf16-weight vectors) of the passages and the queries: precision pinned by name."""
    bf16 = cast_weights(copy.deepcopy(model), "bf16")
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the fp32 model is untouched
    kw = dict(batch_size=16, device="cpu")
    ref = [encode_texts(model, tok, texts, tower, autocast="bf16", **kw)
           for texts, tower in ((passages, "passage"), (queries, "question"))]
    got = [encode_texts(bf16, tok, texts, tower, autocast=inference_autocast("bf16", "bf16"), **kw)
           for texts, tower in ((passages, "passage"), (queries, "question"))]
    for r, g in zip(ref, got):
        assert g.dtype == torch.float32 and g.shape == r.shape
        assert not torch.equal(g, r)  # another computation, not the same path twice
        cos = torch.nn.functional.cosine_similarity(r, g, dim=1)
        assert cos.min().item() >= 0.99, cos.min().item()
    return ref, got


def test_bf16_weights_match_bf16_autocast_tiny_bert(tiny_model_dir, one_thread):
    """The tiny random BERT: every vector at cosine >= 0.99 against bf16 autocast's. Its vectors are nearly
    collinear (random weights), so rankings beyond a clear margin are rounding noise in either path; the
    ranking check is self-retrieval (each query is a passage's text: cosine 1 against the rest)."""
    model, tok = load_biencoder(str(tiny_model_dir))
    passages = random_texts(48, seed=1)
    queries = passages[:8]
    (ref_p, ref_q), (got_p, got_q) = _both_paths(model, tok, passages, queries)
    norm = torch.nn.functional.normalize
    for q, p in ((ref_q, ref_p), (got_q, got_p)):
        assert torch.equal((norm(q, dim=1) @ norm(p, dim=1).T).argmax(1), torch.arange(8))


def test_bf16_weights_keep_minilm_top_k(one_thread):
    """The quality bar on a real model (all-MiniLM-L6-v2, packaged offline): cosine >= 0.99 against bf16 autocast
    on every vector, and each query's top 5 the same passages in the same order up to near-ties: the passage
    bf16 weights put at rank i scores, by the autocast vectors, within 0.5% of autocast's rank-i passage.
    (Exact order does not hold on this random-word corpus: two near-tied passages at ranks 2-3 of one query
    swap, which is why ``weights=auto`` stays fp32 until the bench measures it on real data.)"""
    from dpr.models.hub import default_model_path

    model, tok = load_biencoder(default_model_path())
    passages, queries = random_texts(48, seed=1), random_texts(8, seed=2, lo=3, hi=8)
    (ref_p, ref_q), (got_p, got_q) = _both_paths(model, tok, passages, queries)
    k = 5
    ref_scores = ref_q @ ref_p.T
    ref_top = torch.topk(ref_scores, k).indices
    got_top = torch.topk(got_q @ got_p.T, k).indices
    for r in range(len(queries)):
        assert set(ref_top[r].tolist()) == set(got_top[r].tolist()), (r, ref_top[r], got_top[r])
        want, have = ref_scores[r, ref_top[r]], ref_scores[r, got_top[r]]
        assert torch.all((want - have).abs() <= 0.005 * want.abs()), (r, ref_top[r], got_top[r], want, have)


def test_resolve_weights():
    assert resolve_weights("auto") == "fp32"  # auto keeps today's autocast path
    assert resolve_weights(None) == "fp32"
    assert resolve_weights("fp32", "cpu", "off") == "fp32"
    assert resolve_weights("bf16", "cpu", "auto") == "bf16"
    assert resolve_weights("BF16", "cpu", "bf16") == "bf16"
    assert inference_autocast("bf16", "auto") == "off" and inference_autocast("fp32", "auto") == "auto"
    with pytest.raises(ValueError, match="weights must be one of"):
        resolve_weights("fp16")
    with pytest.raises(ValueError, match="autocast=off contradicts"):
        resolve_weights("bf16", "cpu", "off")
    with pytest.raises(ValueError, match="autocast=fp16 contradicts"):
        resolve_weights("bf16", "cpu", "fp16")
    with pytest.raises(ValueError, match="quantize=int8"):
        resolve_weights("bf16", "cpu", "auto", quantize="int8")
    with pytest.raises(ValueError, match="runtime=onnx"):
        resolve_weights("bf16", "cpu", "auto", runtime="onnx")


def test_encode_records_weights_and_refuses_a_mixed_resume(tiny_model_dir, tiny_data_dir, tmp_path, one_thread):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    kw = dict(num_shards=2, batch_size=4, dtype="float32", runtime="torch", cache_dir=tmp_path / "arrow",
              progress=False, device="cpu")
    out = tmp_path / "emb"
    encode_corpus(tiny_model_dir, passages, out, weights="bf16", **kw)
    shards = list_shards(out)
    assert [s.manifest["weights"] for s in shards] == ["bf16", "bf16"]
    vecs = np.concatenate([np.asarray(s.vectors()) for s in shards])
    assert np.isfinite(vecs).all()
    mtime = shards[0].files.vectors.stat().st_mtime_ns
    encode_corpus(tiny_model_dir, passages, out, weights="bf16", **kw)  # same setting: a resume skips them
    assert shards[0].files.vectors.stat().st_mtime_ns == mtime
    for other in ("auto", "fp32"):
        with pytest.raises(DataError, match="weights=bf16, this run encodes with weights=fp32") as err:
            encode_corpus(tiny_model_dir, passages, out, weights=other, **kw)
        assert "\n" not in str(err.value) and "shard_000_of_002.json" in str(err.value)
    with pytest.raises(DataError, match="weights"):  # one explicit shard: the other shard is checked too
        encode_corpus(tiny_model_dir, passages, out, weights="fp32", shard_id=1, **{**kw})
    assert list_shards(out)[1].files.vectors.stat().st_mtime_ns  # nothing was removed


def test_shards_written_before_weights_were_recorded_are_fp32(tiny_model_dir, tiny_data_dir, tmp_path, one_thread):
    """An older manifest without ``weights`` is fp32's: an fp32 resume reuses it, a bf16 one is refused, and
    the index accepts it next to a new fp32 shard."""
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    kw = dict(num_shards=2, batch_size=4, dtype="float32", runtime="torch", cache_dir=tmp_path / "arrow",
              progress=False, device="cpu", autocast="off")
    out = tmp_path / "emb"
    encode_corpus(tiny_model_dir, passages, out, **kw)
    files = ShardFiles.of(out, 0, 2)
    manifest = json.loads(files.manifest.read_text())
    assert manifest["weights"] == "fp32"
    del manifest["weights"]
    files.manifest.write_text(json.dumps(manifest))
    assert [s.manifest.get("weights") for s in list_shards(out)] == [None, "fp32"]  # agreed: both fp32
    mtime = files.vectors.stat().st_mtime_ns
    encode_corpus(tiny_model_dir, passages, out, weights="fp32", **kw)
    assert files.vectors.stat().st_mtime_ns == mtime
    with pytest.raises(DataError, match="weights=fp32, this run encodes with weights=bf16"):
        encode_corpus(tiny_model_dir, passages, out, weights="bf16", **{**kw, "autocast": "auto"})


def test_index_refuses_shards_of_two_weights_settings(tiny_model_dir, tiny_data_dir, tmp_path, one_thread):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    kw = dict(num_shards=2, batch_size=4, dtype="float32", runtime="torch", cache_dir=tmp_path / "arrow",
              progress=False, device="cpu")
    out = tmp_path / "emb"
    encode_corpus(tiny_model_dir, passages, out, **kw)
    files = ShardFiles.of(out, 1, 2)
    manifest = json.loads(files.manifest.read_text())
    files.manifest.write_text(json.dumps({**manifest, "weights": "bf16"}))  # as if written by another run
    with pytest.raises(DataError, match="field 'weights'"):
        list_shards(out)
