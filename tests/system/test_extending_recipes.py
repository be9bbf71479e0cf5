"""The recipes of docs/extending.md, performed as written: a new loss, a new model preset, a new dataset
recipe and a new validation metric, each from files outside the repository (a tmp package and a tmp config
dir), trained or prepared with the tiny model and data of conftest. If a recipe stops working as the page
says, this file fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.run_command import run_as_subprocess, run_script

pytestmark = pytest.mark.usefixtures("one_thread")

BIN = Path(sys.executable).parent

DOC = REPO / "docs" / "extending.md"


def doc_block(section: str, lang: str, n: int = 0) -> str:
    """The ``n``-th fenced ``lang`` block under ``## <section>`` of docs/extending.md, as the reader copies it."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"docs/extending.md has no section {section!r}"
    blocks = re.findall(rf"^```{lang}\n(.*?)^```$", m.group(1), re.S | re.M)
    assert len(blocks) > n, f"docs/extending.md, {section!r}: fewer than {n + 1} {lang} blocks"
    return blocks[n]


def _env(*pythonpath: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    # the user's package first, then whatever made `dpr` importable here (the worktree or the install)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(REPO), env.get("PYTHONPATH", "")])
    env["WANDB_MODE"] = "disabled"
    return env


def _tiny_data_conf(conf: Path) -> None:
    (conf / "data").mkdir(parents=True, exist_ok=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")


def _dpr_train(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``dpr-train`` run in this process (tests/run_command.py): the recipes are about the files a user adds; a
    user's package is importable through ``user_package``, as ``PYTHONPATH`` makes it for a process."""
    return run_as_subprocess([str(BIN / "dpr-train"), *args], cwd=cwd, env=env)


@pytest.fixture()
def user_package(tmp_path, monkeypatch):
    """``tmp_path/src`` on ``sys.path`` for the test, and the modules imported from it forgotten afterwards."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    monkeypatch.syspath_prepend(str(src))
    yield src
    for name in [m for m, mod in sys.modules.items() if str(src) in str(getattr(mod, "__file__", None) or "")]:
        del sys.modules[name]


def _quick(tiny_data_dir: Path, out: Path) -> list[str]:
    """A one-step fp32 run without validation or checkpoints: the first step's loss is the starting weights'."""
    return ["data=tiny", f"data_dir={tiny_data_dir}", f"output_dir={out}", "train.max_steps=1", "train.batch_size=4",
            "train.hard_negatives=1", "train.precision=fp32", "train.validate=false", "train.save_every=0",
            "train.warmup_ratio=0"]


def _first_loss(run: Path) -> float:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def test_recipe_new_loss_module_and_yaml_train_the_tiny_model(tiny_model_dir, tiny_data_dir, tmp_path, user_package):
    """docs/extending.md "A new loss": a module in the user's own package plus ``conf/loss/<name>.yaml`` in
    the user's config dir; ``loss=<name>`` trains with it and ``loss.<key>=`` reaches its constructor."""
    pkg = user_package / "my_losses"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scaled_nll.py").write_text(doc_block("A new loss", "python"))
    conf = tmp_path / "myconf"
    (conf / "loss").mkdir(parents=True)
    (conf / "loss" / "scaled_nll.yaml").write_text(doc_block("A new loss", "yaml"))
    _tiny_data_conf(conf)
    env = _env(tmp_path / "src")
    model = ["model=tiny", f"model.name={tiny_model_dir}"]
    runs = {}
    for scale in ("1.0", "3.0"):
        out = tmp_path / f"run_{scale}"
        proc = _dpr_train([f"hydra.searchpath=[file://{conf}]", *_quick(tiny_data_dir, out), *model,
                           "loss=scaled_nll", f"loss.scale={scale}"], tmp_path, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[float(scale)] = _first_loss(out)
        saved = (out / ".hydra" / "config.yaml").read_text()
        assert "my_losses.scaled_nll.ScaledNLL" in saved
    # the same seed and starting weights: step 1's loss is the module's, scaled by the YAML key
    assert runs[3.0] == pytest.approx(3.0 * runs[1.0], rel=1e-5)
    assert runs[1.0] > 0

    # the loss's own check is one line naming the key, exit 2
    proc = _dpr_train([f"hydra.searchpath=[file://{conf}]", *_quick(tiny_data_dir, tmp_path / "bad"), *model,
                       "loss=scaled_nll", "loss.scale=-1"], tmp_path, env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "loss.scale must be > 0" in proc.stderr


def test_recipe_new_model_preset_is_a_yaml_in_conf_model(tiny_model_dir, tiny_data_dir, tmp_path):
    """docs/extending.md "A new model preset": ``conf/model/<name>.yaml`` with BiEncoderConfig's keys;
    ``model=<name>`` builds that model (pooling, projection, prefixes saved with the run)."""
    conf = tmp_path / "myconf"
    (conf / "model").mkdir(parents=True)
    preset = doc_block("A new model preset", "yaml")
    assert "\nname: /path/to/encoder" in "\n" + preset
    # the page's preset with `name:` pointed at the tiny model, every other line as written
    preset = re.sub(r"^name: .*$", f"name: {tiny_model_dir}", preset, count=1, flags=re.M)
    (conf / "model" / "tiny_cls128.yaml").write_text(preset)
    _tiny_data_conf(conf)
    out = tmp_path / "run"
    env = _env()
    proc = _dpr_train(["--config-dir", str(conf), *_quick(tiny_data_dir, out), "model=tiny_cls128"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((out / "biencoder.json").read_text())["config"]
    assert saved["pooling"] == "cls" and saved["projection_dim"] == 16
    assert saved["question_prefix"] == "query: " and saved["passage_prefix"] == "passage: "

    from dpr.models import load_biencoder

    model, _ = load_biencoder(str(out))
    assert model.config.projection_dim == 16

    # a misspelt key in the preset is refused when the config is composed: one line naming it
    (conf / "model" / "typo.yaml").write_text(f"name: {tiny_model_dir}\npoolin: cls\n")
    proc = _dpr_train(["--config-dir", str(conf), *_quick(tiny_data_dir, tmp_path / "typo"), "model=typo"],
                      tmp_path, env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "poolin" in proc.stderr


def test_recipe_new_backbone_family_is_a_preset_yaml(tiny_data_dir, tmp_path):
    """docs/extending.md "A new backbone family": a Mistral-shaped causal LM (a tiny random one, built from a config)
    trained by the page's preset alone: a decoder (left padding, last-token pooling), the instruction, LoRA adapters."""
    import torch
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    from dpr.models.hub import default_model_path

    torch.manual_seed(0)
    base = tmp_path / "tiny_mistral"
    tok = AutoTokenizer.from_pretrained(default_model_path())
    tok.add_special_tokens({"eos_token": "[unused1]"})
    MistralForCausalLM(MistralConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                     max_position_embeddings=256)).save_pretrained(base)
    tok.save_pretrained(base)
    conf = tmp_path / "myconf"
    (conf / "model").mkdir(parents=True)
    preset = doc_block("A new backbone family", "yaml")
    assert "\nname: /path/to/causal-lm" in "\n" + preset
    (conf / "model" / "tiny_mistral.yaml").write_text(re.sub(r"^name: .*$", f"name: {base}", preset, count=1,
                                                             flags=re.M))
    _tiny_data_conf(conf)
    out = tmp_path / "run"
    proc = _dpr_train(["--config-dir", str(conf), *_quick(tiny_data_dir, out), "model=tiny_mistral"], tmp_path, _env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads((out / "biencoder.json").read_text())["config"]
    assert saved["pooling"] == "last" and saved["lora"]["r"] == 8 and saved["question_prefix"].startswith("Instruct:")
    assert (out / "question_encoder" / "adapter_model.safetensors").is_file()

    from dpr.models import load_biencoder

    model, loaded_tok = load_biencoder(str(out))
    assert model.decoder and loaded_tok.padding_side == "left"


def _write_faq(path: Path, n: int = 40) -> Path:
    topics = ["honolulu", "paris", "berlin", "everest", "pacific", "atp", "boiling", "photosynthesis", "rome", "nile"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            t = topics[i % len(topics)]
            f.write(f"question {i} about {t}?\t{t}\tA passage about {t} that mentions {t} once.\n")
    return path


def test_recipe_new_dataset_recipe_prepares_and_trains(tiny_model_dir, tmp_path, monkeypatch):
    """docs/extending.md "A new dataset recipe": a module with KIND/VERSION/SOURCES/DEFAULTS/build (and
    local_sources), one entry in ``dpr.data.prepare.RECIPES``; ``prepare_dataset`` builds the layout every
    command reads, a rerun is a no-op, a new VERSION rebuilds, and the trainer trains on it."""
    from dpr.data import prepare as prep
    from dpr.data.dataset import DatasetPaths
    from dpr.data.passages import iter_passages
    from dpr.data.qa import read_qa_tsv
    from dpr.data.retriever_json import read_retriever_json
    from dpr.training.train import train

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "faq.py").write_text(doc_block("A new dataset recipe", "python", 0))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.delitem(sys.modules, "faq", raising=False)
    monkeypatch.setattr(prep, "RECIPES", dict(prep.RECIPES))  # the page's registration, undone after the test
    monkeypatch.chdir(tmp_path)
    source = _write_faq(tmp_path / "faq.tsv")

    # the page's registration snippet, run as written (relative paths: faq.tsv, data/prepared)
    exec(compile(doc_block("A new dataset recipe", "python", 1), "docs/extending.md", "exec"), {})
    faq = sys.modules["faq"]
    assert prep.RECIPES["faq"] is faq
    root = tmp_path / "data" / "prepared" / "myfaq"
    cfg = {"name": "myfaq", "recipe": "faq", "kind": "qa", "path": "faq.tsv"}
    ds = DatasetPaths(root)
    assert ds.kind == "qa"
    meta = ds.read_meta()
    assert meta["recipe"] == "faq" and meta["recipe_version"] == 1
    assert str(source.resolve()) in meta["sources"]
    passages = list(iter_passages(ds.passages))
    train_ex, dev_ex = read_retriever_json(ds.train), read_retriever_json(ds.dev)
    test = read_qa_tsv(ds.qa("test"))
    assert len(passages) == 10 and len(train_ex) + len(dev_ex) + len(test) == 40 and dev_ex and test
    train_pids = {c["passage_id"] for ex in train_ex for c in ex["positive_ctxs"]}
    dev_pids = {c["passage_id"] for ex in dev_ex for c in ex["positive_ctxs"]}
    assert not train_pids & dev_pids  # split by passage

    stamp = (root / "meta.json").stat().st_mtime_ns
    prep.prepare_dataset(cfg, "data/prepared")  # same recipe, config and source: up to date
    assert (root / "meta.json").stat().st_mtime_ns == stamp
    monkeypatch.setattr(faq, "VERSION", 2)
    prep.prepare_dataset(cfg, "data/prepared")  # "bump VERSION when its output changes": rebuilt
    assert ds.read_meta()["recipe_version"] == 2

    bad = tmp_path / "bad.tsv"
    bad.write_text("only a question\n")
    from dpr.errors import DataError

    with pytest.raises(DataError, match=r"bad\.tsv:1"):
        prep.prepare_dataset({**cfg, "name": "bad", "path": str(bad)}, "data/prepared")
    assert not (tmp_path / "data" / "prepared" / "bad").exists()  # built aside: nothing half-written

    summary = train({
        "model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {"name": "myfaq", "kind": "qa"}, "logger": {"type": "none"},
        "train": {"batch_size": 4, "hard_negatives": 0, "max_steps": 2, "lr": 1e-3, "warmup_ratio": 0.0,
                  "print_every": 1000, "val_batch_size": 8, "precision": "fp32", "save_every": 0},
        "data_dir": str(tmp_path / "data" / "prepared"), "output_dir": str(tmp_path / "run"), "seed": 7,
    })
    assert summary["steps"] == 2 and (tmp_path / "run" / "biencoder.json").is_file()


def test_recipe_new_negative_source_mines_through_the_one_filter(tiny_data_dir, tmp_path, monkeypatch):
    """docs/extending.md "A new negative source", step 1 as written (in a tmp working directory holding the
    tiny dataset as data/prepared/squad1_open, with filler passages so ranks past the skipped top 10 exist):
    the file it writes holds no positive, no answer-bearing passage (text or title) and nothing of the top 10."""
    from dpr.data.passages import iter_passages, write_passages
    from dpr.data.retriever_json import read_retriever_json
    from dpr.eval.has_answer import has_answer
    from dpr.retrieval import Retriever

    root = tmp_path / "data" / "prepared" / "squad1_open"
    shutil.copytree(tiny_data_dir / "tiny", root)
    filler = [{"id": f"f{i}", "text": f"the capital city is the largest of the {i} cells in the ocean", "title": ""}
              for i in range(30)]
    write_passages(root / "passages.tsv", [*iter_passages(root / "passages.tsv"), *filler])
    monkeypatch.chdir(tmp_path)
    exec(compile(doc_block("A new negative source", "python"), "docs/extending.md", "exec"), {})

    mined = read_retriever_json(tmp_path / "runs" / "negatives" / "train.json")
    examples = read_retriever_json(root / "train.json")
    top10 = Retriever.bm25(root / "passages.tsv").search_ids([ex["question"] for ex in examples], k=10)
    assert len(mined) == len(examples) and sum(len(ex["hard_negative_ctxs"]) for ex in mined) > 0
    for ex, top in zip(mined, top10):
        skipped = {pid for pid, _ in top}
        for c in ex["hard_negative_ctxs"]:
            assert c["passage_id"] not in skipped and c["passage_id"] not in {p["passage_id"] for p in ex["positive_ctxs"]}
            assert not has_answer(ex["answers"], c["text"]) and not has_answer(ex["answers"], c["title"])


def test_recipe_new_validation_metric_keeps_the_weights_it_prefers(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                   user_package, monkeypatch):
    """docs/extending.md "A new validation metric": a module registering a ``DevMetric`` and the page's
    ``my_train.py`` (``dpr-train`` after one import); ``train.best_metric=<name>`` keeps the weights by it,
    lower being better as the object says (the old name rule would have read ``first_hit@20`` as an accuracy)."""
    from dpr.training import dev_metrics
    from dpr.training.dev_metrics import greater_is_better

    section = "A new validation metric"
    pkg = user_package / "my_metrics"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "first_hit.py").write_text(doc_block(section, "python", 0))
    (tmp_path / "my_train.py").write_text(doc_block(section, "python", 1))
    command = doc_block(section, "bash")
    assert "my_train.py" in command
    selected = re.search(r"train\.best_metric=(\S+)", command).group(1)
    assert selected == "first_hit@20" and greater_is_better(selected)  # unregistered here: the name rule's guess
    conf = tmp_path / "myconf"
    _tiny_data_conf(conf)
    out = tmp_path / "run"
    args = [f"hydra.searchpath=[file://{conf}]", "data=tiny", f"data_dir={tiny_data_dir}", f"output_dir={out}",
            "model=tiny", f"model.name={tiny_model_dir}", "train.max_steps=4", "train.batch_size=4",
            "train.hard_negatives=1", "train.precision=fp32", "train.save_every=0", "train.warmup_ratio=0",
            "train.lr=1e-3", "train.eval_every=1", "train.validate_at_start=true", f"train.best_metric={selected}"]
    proc = subprocess.run([sys.executable, "my_train.py", *args], cwd=tmp_path, env=_env(tmp_path / "src"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    # reported after the built-ins, which keep their keys and order
    assert list(rows[0]) == ["step", "avg_rank", "avg_rank_ci95", "mrr", "mrr_ci95", "rank_pool_size", "num_questions",
                             "top1", "top1_ci95", "top5", "top5_ci95", "top20", "top20_ci95",
                             "first_hit@20", "first_hit@20_ci95", "epoch"]
    values = [r["first_hit@20"] for r in rows]
    assert all(1 <= v <= 21 for v in values) and len(set(values)) > 1  # the weights it compares do differ
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["resolved"]["best_metric"] == "first_hit@20"
    assert summary["best_metric"] == {"name": "first_hit@20", "value": min(values)}  # lowest: greater_is_better=False
    assert summary["best_step"] == rows[values.index(min(values))]["step"]  # the first validation reaching it

    # a name nobody registered is refused before training, the registered ones listed (the script in this
    # process: its registration into a copy of the registry, forgotten after the test)
    monkeypatch.setattr(dev_metrics, "_REGISTRY", dict(dev_metrics._REGISTRY))
    bad = [*args[:3], f"output_dir={tmp_path / 'bad'}", *args[4:-1], "train.best_metric=first_hit@10"]
    proc = run_script("my_train.py", bad, cwd=tmp_path, env=_env(tmp_path / "src"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "best_metric='first_hit@10' is not a dev metric" in proc.stderr and "ndcg@10, first_hit@20" in proc.stderr
