"""Shared fixtures: a tiny random BERT (seconds to train), a tiny QA dataset, and the real-data mirror."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

# dpr before torch, as in the commands: OpenMP's threads then wait passively (OMP_WAIT_POLICY=PASSIVE) instead of
# spinning against the other worker on a 2-core machine, and a command run in-process (tests/run_command.py) has
# nothing to warn about on that account that its installed script would not
import dpr  # noqa: F401,E402

os.environ.setdefault("WANDB_MODE", "disabled")

# Property tests assert behaviour, not speed: hypothesis's default 200 ms deadline per example fails them on a
# loaded 2-core machine (an example that builds a model can take longer there), so no deadline anywhere.
settings.register_profile("dpr", deadline=None)
settings.load_profile("dpr")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]

# which tests are slow comes from their measured durations (tests/durations.json), not from a hand-kept list
pytest_plugins = ["tests.durations"]


CI = os.environ.get("CI") == "true"


def _default_mirror() -> Path:
    """The mirror, absolute: a relative ``DPR_DATA_MIRROR`` means relative to where pytest was started
    (the README runs ``DPR_DATA_MIRROR=../shared/data`` from the repository root), and the tests hand it
    to subprocesses that run in other directories."""
    return Path(os.path.abspath(os.environ.get("DPR_DATA_MIRROR", REPO.parent / "shared" / "data")))


# Exported absolute once, at start-up, before any test changes directory or spawns a command.
if os.environ.get("DPR_DATA_MIRROR"):
    os.environ["DPR_DATA_MIRROR"] = str(_default_mirror())


def _missing_library(report) -> bool:
    return report.skipped and "could not import" in str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Under CI=true a test module skipped for a missing library (``importorskip``: pytrec_eval for the
    qrels cross-check) is a failure: CI must not go green without the check it was meant to run."""
    outcome = yield
    report = outcome.get_result()
    if CI and _missing_library(report):
        report.outcome = "failed"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if CI and _missing_library(report):
        report.outcome = "failed"


@pytest.fixture(autouse=True)
def torch_global_state_is_left_as_found():
    """A test (or a script's ``main`` it calls in-process) that turns autograd off globally breaks every later test
    in its worker with "does not require grad" far from the cause (a CI run once had 28 failures from one script's
    ``torch.set_grad_enabled(False)``). Fail the test that leaks, and restore the state for the rest."""
    import torch

    grad, dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    yield
    leaked = [f"{name} {after} (was {before})" for name, before, after in
              (("grad enabled", grad, torch.is_grad_enabled()), ("default dtype", dtype, torch.get_default_dtype()))
              if before != after]
    torch.set_grad_enabled(grad)
    torch.set_default_dtype(dtype)
    assert not leaked, "this test left torch's global state changed: " + ", ".join(leaked)


# What a process reads to join a distributed run: a test that leaves one set (adopting a Slurm task's ranks
# in-process, say) makes every later in-process training in its worker wait forever for ranks that never come.
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "ROLE_RANK", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def rank_variables_are_left_as_found():
    """Fail the test that leaves a rank variable changed in ``os.environ``, and restore them for the rest."""
    before = {k: os.environ.get(k) for k in RANK_VARS}
    yield
    after = {k: os.environ.get(k) for k in RANK_VARS}
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    leaked = [f"{k}={after[k]!r} (was {before[k]!r})" for k in RANK_VARS if after[k] != before[k]]
    assert not leaked, "this test left rank variables set: " + ", ".join(leaked)


def directory_tree(root: Path) -> dict[str, bytes]:
    """Every path under ``root`` with its contents (a directory as ``<dir>``), byte for byte: what a refused
    command must leave as it found it."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


@pytest.fixture()
def read_only_dir(tmp_path):
    """A read-only file system at ``<tmp>/ro``: even root cannot write there (skipped where no tmpfs can be
    mounted)."""
    import shutil
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    yield ro
    subprocess.run(["umount", str(ro)], check=False)


@pytest.fixture(scope="session")
def mirror_dir() -> Path:
    """The real-data mirror. Absent: skip with a reason, except under CI=true where it is a failure."""
    path = _default_mirror()
    if not (path / "squad-v1.1").is_dir():
        msg = f"real-data mirror not found at {path} (set DPR_DATA_MIRROR)"
        if CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture()
def one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread is faster than two oversubscribed ones."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's (BERT uncased) tokenizer, saved in HF format."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from dpr.models.hub import default_model_path

    out = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(default_model_path())
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
    )
    BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


TINY_PASSAGES = [
    ("p1", "Honolulu is the capital of Hawaii and lies on the island of Oahu.", "Honolulu"),
    ("p2", "Paris is the capital and most populous city of France.", "Paris"),
    ("p3", "The mitochondria is the powerhouse of the cell, producing ATP.", "Mitochondrion"),
    ("p4", "Mount Everest is Earth's highest mountain above sea level.", "Mount Everest"),
    ("p5", "Photosynthesis converts light energy into chemical energy in plants.", "Photosynthesis"),
    ("p6", "The Pacific Ocean is the largest and deepest of Earth's oceans.", "Pacific Ocean"),
    ("p7", "Water boils at 100 degrees Celsius at sea level.", "Water"),
    ("p8", "Berlin is the capital of Germany.", "Berlin"),
]

TINY_QA = [
    ("what is the capital of hawaii", ["Honolulu"], "p1"),
    ("what is the capital of france", ["Paris"], "p2"),
    ("what produces atp in the cell", ["mitochondria"], "p3"),
    ("what is the highest mountain", ["Mount Everest"], "p4"),
    ("how do plants convert light energy", ["Photosynthesis"], "p5"),
    ("which is the largest ocean", ["Pacific Ocean", "Pacific"], "p6"),
    ("at what temperature does water boil", ["100 degrees Celsius"], "p7"),
    ("what is the capital of germany", ["Berlin"], "p8"),
]


def write_tiny_dataset(root: Path) -> Path:
    """Write a tiny dataset in the on-disk layout `dpr-data` produces (passages.tsv, train/dev json, dev/test .qa.tsv)."""
    root.mkdir(parents=True, exist_ok=True)
    by_id = {pid: (text, title) for pid, text, title in TINY_PASSAGES}
    with open(root / "passages.tsv", "w", encoding="utf-8") as f:
        f.write("id\ttext\ttitle\n")
        for pid, text, title in TINY_PASSAGES:
            f.write(f"{pid}\t{text}\t{title}\n")

    def example(q, answers, pid):
        text, title = by_id[pid]
        return {
            "question": q,
            "answers": answers,
            "positive_ctxs": [{"passage_id": pid, "title": title, "text": text}],
            "negative_ctxs": [],
            "hard_negative_ctxs": [],
        }

    examples = [example(*qa) for qa in TINY_QA]
    (root / "train.json").write_text(json.dumps(examples, indent=1), encoding="utf-8")
    (root / "dev.json").write_text(json.dumps(examples[:4], indent=1), encoding="utf-8")
    with open(root / "test.qa.tsv", "w", encoding="utf-8") as f:
        for q, answers, _ in TINY_QA:
            f.write(f"{q}\t{json.dumps(answers)}\n")
    with open(root / "dev.qa.tsv", "w", encoding="utf-8") as f:
        for q, answers, _ in TINY_QA[:4]:
            f.write(f"{q}\t{json.dumps(answers)}\n")
    (root / "meta.json").write_text(json.dumps({"name": root.name, "kind": "qa"}), encoding="utf-8")
    return root



@pytest.fixture()
def tiny_model_no_dropout(tiny_model_dir, tmp_path) -> Path:
    """The tiny BERT without dropout: runs with different process counts then compute the same numbers."""
    from transformers import AutoTokenizer, BertModel

    out = tmp_path / "tiny_nodrop"
    model = BertModel.from_pretrained(tiny_model_dir)
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out

@pytest.fixture()
def tiny_data_dir(tmp_path) -> Path:
    """``<tmp>/data`` holding one dataset ``tiny`` (the layout `data_dir/<name>/`)."""
    write_tiny_dataset(tmp_path / "data" / "tiny")
    return tmp_path / "data"


def overlap_scorer(questions, passages):
    """A tiny deterministic teacher for tests: shared words of question and title + text (a lexical
    cross-encoder stand-in), minus a length penalty so ties are rare."""
    out = []
    for q, p in zip(questions, passages):
        words = f"{p.get('title') or ''} {p['text']}".lower().replace(",", " ").replace(".", " ").split()
        out.append(len(set(q.lower().split()) & set(words)) - 0.01 * len(words))
    return out


def add_tiny_hard_negatives(root: Path, per_question: int = 3) -> None:
    """Give each tiny training question ``per_question`` hard negatives (the next passages in order), so a
    teacher has candidates to rank besides the positive."""
    by_id = {pid: (text, title) for pid, text, title in TINY_PASSAGES}
    ids = [pid for pid, _, _ in TINY_PASSAGES]
    examples = json.loads((root / "train.json").read_text(encoding="utf-8"))
    for ex in examples:
        k = ids.index(ex["positive_ctxs"][0]["passage_id"])
        ex["hard_negative_ctxs"] = [
            {"passage_id": pid, "title": by_id[pid][1], "text": by_id[pid][0]}
            for pid in (ids[(k + d) % len(ids)] for d in range(1, per_question + 1))]
    (root / "train.json").write_text(json.dumps(examples, indent=1), encoding="utf-8")


def write_tiny_teacher_scores(root: Path) -> Path:
    """``root/teacher_scores.jsonl`` (+ manifest) of the tiny dataset, scored by :func:`overlap_scorer`."""
    from dpr.training.teacher_scores import SCORES_FILE, score_candidates

    add_tiny_hard_negatives(root)
    score_candidates(overlap_scorer, root / "train.json", root / SCORES_FILE, teacher_fingerprint="test:overlap")
    return root / SCORES_FILE


def build_tiny_decoder(out: Path, family: str) -> Path:
    """A randomly initialised 2-layer causal LM (``llama`` or ``qwen2`` shapes: grouped-query attention, RoPE,
    SwiGLU) saved as a ``*ForCausalLM`` checkpoint, with MiniLM's tokenizer given an EOS token (``[unused1]``):
    no LLM weights load offline here, and these shapes are what Llama/Qwen2/Mistral checkpoints load into."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from dpr.models.hub import default_model_path

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(default_model_path())
    tok.add_special_tokens({"eos_token": "[unused1]"})
    shape = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    model_cls(config_cls(**shape)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return build_tiny_decoder(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2")
