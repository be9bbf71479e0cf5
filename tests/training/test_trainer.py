"""The trainer: batching rules, the CLI interface, determinism, learning, validation and the final model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpr.training.batch_order import global_batches, rank_slice
from dpr.training.batching import NegativePool, TrainBatches, make_item
from dpr.training.train import TrainConfig, train
from dpr.trainkit.metrics_log import read_jsonl
from dpr.trainkit.precision import resolve_precision
from tests.training.helpers import train_batches
from tests.run_command import run_as_subprocess

REPO = Path(__file__).resolve().parents[2]


# tiny models on a shared 2-core box: one intra-op thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_cfg(model_dir: Path, data_dir: Path, out: Path, **train_kw) -> dict:
    train_cfg = {"batch_size": 4, "hard_negatives": 1, "max_steps": 4, "lr": 1e-3, "warmup_ratio": 0.0,
                 "print_every": 1000, "val_batch_size": 8, **train_kw}
    return {
        "model": {"name": str(model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {"name": "tiny", "kind": "qa"},
        "train": train_cfg,
        "logger": {"type": "none"},
        "data_dir": str(data_dir),
        "output_dir": str(out),
        "seed": 7,
    }


def _ex(i: int, pos: str, negs=(), hard=()) -> dict:
    ctx = lambda pid: {"passage_id": pid, "title": f"T{pid}", "text": f"text {pid}"}  # noqa: E731
    return {"question": f"q{i}", "answers": [], "positive_ctxs": [ctx(pos)],
            "negative_ctxs": [ctx(n) for n in negs], "hard_negative_ctxs": [ctx(h) for h in hard]}


# ---------------------------------------------------------------- batching


def test_global_batches_are_seeded_full_and_free_of_duplicate_positives():
    # 10 questions, but q0/q1 and q2/q3 share a positive passage (SQuAD-like)
    examples = [_ex(i, f"p{i // 2}" if i < 4 else f"p{i}") for i in range(10)]
    b1 = global_batches(examples, 4, seed=3, epoch=0)
    assert b1 == global_batches(examples, 4, seed=3, epoch=0)  # deterministic
    assert b1 != global_batches(examples, 4, seed=3, epoch=1)  # reshuffled per epoch
    assert all(len(b) == 4 for b in b1) and len(b1) == 2  # the incomplete tail is dropped
    for batch in b1:
        pos = [examples[i]["positive_ctxs"][0]["passage_id"] for i in batch]
        assert len(set(pos)) == len(pos)
    flat = [i for b in b1 for i in b]
    assert len(set(flat)) == len(flat)
    plain = global_batches(examples, 4, seed=3, epoch=0, shuffle=False, dedup_positives=False)
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_ranks_take_disjoint_slices_of_the_same_global_batch():
    batch = list(range(12))
    parts = [rank_slice(batch, r, 3) for r in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    examples = [_ex(i, f"p{i}") for i in range(16)]
    # 1 rank x batch 8 and 2 ranks x batch 4 see the same global batches
    single = train_batches(examples, None, batch_size=8, hard_negatives=0, question_max_length=8,
                          passage_max_length=8, seed=1)
    ranks = [train_batches(examples, None, batch_size=4, hard_negatives=0, question_max_length=8,
                          passage_max_length=8, seed=1, rank=r, world_size=2) for r in range(2)]
    for b in range(single.num_batches(0)):
        together = [it.question for it in single.items(0, b)]
        split = [it.question for r in ranks for it in r.items(0, b)]
        assert together == split


def test_hard_negatives_shuffled_per_epoch_and_topped_up_from_the_pool():
    examples = [_ex(0, "a", negs=["n1"], hard=["h1", "h2", "h3"]), _ex(1, "b"), _ex(2, "c", hard=["h4"])]
    pool = NegativePool(examples)
    item = make_item(examples[0], 0, epoch=0, seed=5, hard_negatives=2, pool=pool)
    assert item.passages[0]["passage_id"] == "a" and len(item.passages) == 3
    assert {c["passage_id"] for c in item.passages[1:]} <= {"h1", "h2", "h3", "n1"}
    picks = {tuple(c["passage_id"] for c in make_item(examples[0], 0, e, 5, 2, pool).passages[1:]) for e in range(8)}
    assert len(picks) > 1  # the choice changes across epochs
    assert make_item(examples[0], 0, 3, 5, 2, pool) == make_item(examples[0], 0, 3, 5, 2, pool)
    unshuffled = make_item(examples[0], 0, 3, 5, 2, pool, shuffle_hard_negatives=False)
    assert [c["passage_id"] for c in unshuffled.passages[1:]] == ["h1", "h2"]  # BM25 order, hard first
    # a question without negatives is topped up with other passages, never its own positive
    filled = make_item(examples[1], 1, 0, 5, 3, pool)
    ids = [c["passage_id"] for c in filled.passages]
    assert ids[0] == "b" and len(ids) == 4 and len(set(ids)) == 4 and "b" not in ids[1:]
    assert make_item(examples[1], 1, 0, 5, 0, pool).passages == [examples[1]["positive_ctxs"][0]]


def test_train_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown train config keys"):
        TrainConfig.from_dict({"batchsize": 4})
    with pytest.raises(ValueError, match="precision"):
        TrainConfig.from_dict({"precision": "fp8"})
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        resolve_precision("fp16", torch.device("cpu"), training=True)
    assert resolve_precision("fp32", torch.device("cpu"), training=True) == "fp32"
    assert resolve_precision("auto", torch.device("cpu"), training=True) in ("fp32", "bf16")


# ---------------------------------------------------------------- training


@pytest.mark.precision  # compares numbers under auto: runs under both rules in .ci/run
def test_same_seed_same_losses(tiny_model_dir, tiny_data_dir, tmp_path):
    a = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "a", max_steps=3, validate=False))
    b = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "b", max_steps=3, validate=False))
    la = [r["loss"] for r in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    lb = [r["loss"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert len(la) == 3 and la == lb
    assert a["final_weights"] == "last"
    c = train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "c", max_steps=3, validate=False) | {"seed": 8})
    assert [r["loss"] for r in read_jsonl(tmp_path / "c" / "metrics.jsonl")] != la
    assert b["steps"] == c["steps"] == 3


@pytest.mark.precision  # compares numbers under auto: runs under both rules in .ci/run
def test_loss_decreases_and_best_weights_are_saved(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    summary = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=30, hard_negatives=1, lr=2e-3,
                             eval_every=10, val_corpus_topk=True))
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert {"loss", "lr", "accuracy", "avg_rank", "examples_per_s", "epoch"} <= set(rows[0])
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    val = read_jsonl(out / "validation.jsonl")
    # every epoch end (2 steps each on the tiny set) plus every 10 steps, once per step
    assert [r["step"] for r in val] == list(range(2, 31, 2))
    assert {"avg_rank", "mrr", "top1", "top5", "top20"} <= set(val[0])
    best = min(val, key=lambda r: r["avg_rank"])
    assert summary["best_step"] == best["step"]
    assert summary["final_metrics"]["val_avg_rank"] == best["avg_rank"]
    # the saved model is the best one: re-validate it and get the best numbers back
    from dpr.models import load_biencoder
    from dpr.training.batching import load_examples
    from dpr.training.validation import DevEncoding, average_rank

    model, tok = load_biencoder(out)
    dev = load_examples(tiny_data_dir / "tiny" / "dev.json")
    again = average_rank(model, tok, dev, encoding=DevEncoding(
        question_max_length=32, passage_max_length=64,
        autocast="off" if summary["precision"] == "fp32" else summary["precision"]))
    assert again["avg_rank"] == pytest.approx(best["avg_rank"])
    saved = json.loads((out / "train_summary.json").read_text())
    assert saved["steps"] == 30 and saved["best_step"] == best["step"] and saved["wall_time_s"] > 0


@pytest.mark.precision  # compares numbers under auto: runs under both rules in .ci/run
def test_validate_at_start_records_the_starting_weights(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    summary = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2, validate_at_start=True))
    val = read_jsonl(out / "validation.jsonl")
    assert [r["step"] for r in val][0] == 0
    assert summary["initial_validation"]["avg_rank"] == val[0]["avg_rank"]
    # the untrained weights compete for "best": the saved model is never worse on dev than where it started
    assert summary["final_metrics"]["val_avg_rank"] <= val[0]["avg_rank"]


def test_grad_accumulation_and_grad_cache_runs(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "acc", max_steps=2, batch_size=2,
                   grad_accumulation_steps=2, grad_cache_chunk_size=3, precision="fp32", validate=False)
    summary = train(cfg)
    rows = read_jsonl(tmp_path / "acc" / "metrics.jsonl")
    # 2 questions per micro-batch: the pool is 2 x (1 + 1) passages, accumulation adds none
    assert [r["negatives"] for r in rows] == [3, 3]
    assert summary["examples_per_s"] > 0 and rows[-1]["epoch"] == 1.0  # 4 micro-batches = 1 epoch


def test_bad_config_and_missing_data_fail_clearly(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no training data"):
        train(tiny_cfg(tiny_model_dir, tmp_path / "nowhere", tmp_path / "o"))
    with pytest.raises(ValueError, match="fewer than grad_accumulation_steps"):
        train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "o", batch_size=8, grad_accumulation_steps=2))
    bad = tiny_data_dir / "tiny" / "train.json"
    bad.write_text(json.dumps([{"question": "q", "answers": [], "positive_ctxs": [{"title": "t", "text": "x"}]}]))
    from dpr.errors import DataError

    with pytest.raises(DataError, match="passage_id"):
        train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "o"))


# ---------------------------------------------------------------- CLI


def _env() -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", HYDRA_FULL_ERROR="1",
               OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    return env


def dpr_train() -> list[str]:
    """The installed console script (the interface users type), else the module."""
    script = Path(sys.executable).parent / "dpr-train"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dpr.cli.train"]


def write_tiny_data_conf(conf_dir: Path) -> Path:
    (conf_dir / "data").mkdir(parents=True, exist_ok=True)
    (conf_dir / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    return conf_dir


def test_cli_interface_writes_loadable_towers_and_metrics(tiny_model_dir, tiny_data_dir, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    conf = write_tiny_data_conf(tmp_path / "conf")
    out = tmp_path / "cli_run"
    cmd = [*dpr_train(), "--config-dir", str(conf),
           "data=tiny", f"data_dir={tiny_data_dir}", f"output_dir={out}", "train.max_steps=3",
           "train.batch_size=4", "train.hard_negatives=1",
           "model=tiny", f"model.name={tiny_model_dir}", "train.val_batch_size=8"]
    proc = run_as_subprocess(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for tower in ("question_encoder", "passage_encoder"):
        model = AutoModel.from_pretrained(out / tower)
        tok = AutoTokenizer.from_pretrained(out / tower)
        with torch.no_grad():
            assert model(**tok(["what is the capital of france"], return_tensors="pt")).last_hidden_state.shape[-1] == 32
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(isinstance(r["loss"], float) for r in rows)
    assert (out / ".hydra" / "config.yaml").is_file() and (out / "train_summary.json").is_file()
    assert not list(tmp_path.glob("outputs")) and not list(tmp_path.glob("runs"))  # nothing in the cwd
    summary = json.loads((out / "train_summary.json").read_text())
    assert "train.max_steps=3" in summary["overrides"]


def test_cli_bad_input_is_one_line_exit_2(tiny_model_dir, tiny_data_dir, tmp_path):
    conf = write_tiny_data_conf(tmp_path / "conf")
    (tiny_data_dir / "tiny" / "train.json").write_text("[{\"question\": 3}]")
    cmd = [*dpr_train(), "--config-dir", str(conf), "data=tiny",
           f"data_dir={tiny_data_dir}", f"output_dir={tmp_path / 'o'}", "model=tiny", f"model.name={tiny_model_dir}"]
    proc = run_as_subprocess(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "dpr-train: error:" in proc.stderr and "train.json" in proc.stderr and "question" in proc.stderr


def test_validation_reuses_corpus_vectors_without_changing_numbers(tiny_model_dir, tiny_data_dir):
    from dpr.models import load_biencoder
    from dpr.training.batching import load_examples
    from dpr.training.validation import DevEncoding, average_rank, corpus_topk_accuracy, load_corpus, validate

    torch.manual_seed(0)
    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean", question_max_length=32, passage_max_length=64)
    dev = load_examples(tiny_data_dir / "tiny" / "dev.json")
    dev[0]["hard_negative_ctxs"] = [{"passage_id": "p9", "title": "", "text": "a passage outside the corpus"}]
    corpus = load_corpus(tiny_data_dir / "tiny" / "passages.tsv")
    kw = dict(encoding=DevEncoding(question_max_length=32, passage_max_length=64, autocast="off"))
    together = validate(model, tok, dev, corpus=corpus, use_answers=True, cfg={"val_topk": [1, 2, 20]}, **kw)
    alone = average_rank(model, tok, dev, **kw)
    topk = corpus_topk_accuracy(model, tok, dev, corpus, ks=[1, 2, 20], **kw)
    assert together["avg_rank"] == pytest.approx(alone["avg_rank"]) and together["rank_pool_size"] == 5
    assert {k: together[k] for k in topk} == pytest.approx(topk)
    assert topk["top20"] == 1.0  # 8 passages: every answer is in the top 20
    # ids instead of answers (qrels data): the positive passage is the hit
    by_id = corpus_topk_accuracy(model, tok, dev, corpus, ks=[8], use_answers=False, **kw)
    assert by_id["top8"] == 1.0


@pytest.mark.slow
def test_torchrun_two_cpu_processes_match_one_process(tiny_model_no_dropout, tiny_data_dir, tmp_path):
    """gloo DDP, 2 ranks x batch 2 = 1 process x batch 4: same global batches, same losses; only rank 0 writes.
    Length buckets of 3 split each rank's 4 passages and the one process's 8 differently: still the same losses."""
    conf = write_tiny_data_conf(tmp_path / "conf")
    common = ["--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}", "model=tiny",
              f"model.name={tiny_model_no_dropout}", "train.max_steps=3", "train.hard_negatives=1",
              "train.precision=fp32", "train.lr=1e-3", "train.val_batch_size=8", "train.save_every=2",
              "train.warmup_ratio=0.0", "train.print_every=1000", "train.length_bucket_size=3", "seed=7"]
    work = tmp_path / "cwd"
    work.mkdir()
    script = dpr_train()
    # torchrun runs a script file (the installed dpr-train), or a module with -m
    ddp = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *(script if len(script) == 1 else ["-m", "dpr.cli.train"])]
    proc = subprocess.run([*ddp, *common, f"output_dir={tmp_path / 'ddp'}", "train.batch_size=2"],
                          cwd=work, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train(tiny_cfg(tiny_model_no_dropout, tiny_data_dir, tmp_path / "one", max_steps=3, batch_size=4,
                   precision="fp32", lr=1e-3, save_every=2, length_bucket_size=3))
    ddp_rows = read_jsonl(tmp_path / "ddp" / "metrics.jsonl")
    one_rows = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    assert [r["negatives"] for r in ddp_rows] == [7, 7, 7]  # the pool spans both ranks: 4 questions x 2 passages
    assert [r["loss"] for r in ddp_rows] == pytest.approx([r["loss"] for r in one_rows], abs=1e-5)
    summary = json.loads((tmp_path / "ddp" / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    # rank 0 saved every rank's RNG state (keep_checkpoints=1 in conf/train/default.yaml: the last only)
    rngs = torch.load(tmp_path / "ddp" / "checkpoints" / "step_3" / "rng.pt", weights_only=True)
    assert len(rngs) == 2 and not (tmp_path / "ddp" / "checkpoints" / "step_2").exists()
    assert list(work.iterdir()) == []  # rank 1 wrote nothing in its working directory


def test_each_phase_gets_its_own_warmup_and_decay():
    from dpr.trainkit.optim import linear_schedule, phased_schedule

    def lrs(sched, n):
        out = []
        for _ in range(n):
            out.append(sched.get_last_lr()[0])
            sched.optimizer.step()
            sched.step()
        return out

    def opt():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)

    # one phase: exactly the linear schedule
    assert lrs(phased_schedule(opt(), [0, 10], 2), 10) == pytest.approx(lrs(linear_schedule(opt(), 2, 10), 10))
    got = lrs(phased_schedule(opt(), [4, 6], warmup_steps=1), 10)
    first = lrs(linear_schedule(opt(), 1, 4), 4)
    second = lrs(linear_schedule(opt(), 1, 6), 6)
    assert got == pytest.approx(first + second)  # the second phase warms up again from its own start


def test_validation_ndcg_on_qrels_data_is_trec_evals_graded_ndcg():
    from dpr.training.validation import corpus_topk_accuracy

    class Dot:  # the validator asks the model only for its similarity
        def similarity(self, q, p):
            return q @ p.T

    corpus = (["a", "b", "c"], ["ta", "tb", "tc"], ["", "", ""])
    p = torch.eye(3)
    q = torch.tensor([[0.1, 0.9, 0.5], [0.9, 0.1, 0.0]])  # ranks b, c, a and a, b, c
    dev = [{"question": "q1", "answers": [], "positive_ctxs": [{"passage_id": "a", "title": "", "text": "ta"}],
            "qrels": {"a": 2, "c": 1}},
           {"question": "q2", "answers": [], "positive_ctxs": [{"passage_id": "c", "title": "", "text": "tc"}]}]
    out = corpus_topk_accuracy(Dot(), None, dev, corpus, ks=[1, 2], use_answers=False,
                               question_vectors=q, passage_vectors=p)
    ideal1 = 2 + 1 / math.log2(3)
    ndcg1 = (1 / math.log2(3) + 2 / math.log2(4)) / ideal1  # c at rank 2 (grade 1), a at rank 3 (grade 2)
    ndcg2 = (1 / math.log2(4)) / 1.0  # no qrels: its positive c, grade 1, at rank 3
    assert out["ndcg@10"] == pytest.approx((ndcg1 + ndcg2) / 2)
    # top-k counts any judged-relevant passage (c for q1, though not in its positive_ctxs)
    assert (out["top1"], out["top2"]) == (0.0, 0.5)
    qa = corpus_topk_accuracy(Dot(), None, dev, corpus, ks=[1], use_answers=True, question_vectors=q, passage_vectors=p)
    assert "ndcg@10" not in qa  # QA data: top-k only


def test_batches_take_their_config_whole():
    """TrainBatches takes the typed TrainConfig and the model's config whole: every batching key is read
    from them, and the batches follow them (here shuffle_positives and the batch size)."""
    from dpr.models.biencoder import BiEncoderConfig
    from dpr.training.config import TrainConfig

    examples = [_ex(i, f"p{i % 6}") for i in range(16)]  # shared positives: dedup shapes the batches
    tc = TrainConfig(batch_size=4, hard_negatives=1, shuffle_positives=True, topic_batches=False)
    model = BiEncoderConfig(question_max_length=8, passage_max_length=16, question_prefix="q: ")
    typed = TrainBatches(examples, None, tc, model, seed=3, multi_positive=False, mask_answers=True)
    assert (typed.q_len, typed.p_len, typed.hard_negatives, typed.shuffle_positives) == (8, 16, 1, True)
    assert typed.batch_size == 4 and typed.prefixes == {"question_prefix": "q: ", "passage_prefix": ""}
    assert typed.global_batches(0) == global_batches(examples, 4, 3, 0)
