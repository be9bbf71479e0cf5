"""The recipes of docs/extending.md, performed as written: a new loss, a new model preset and a new dataset
recipe, each from files outside the repository (a tmp package and a tmp config dir), trained or prepared
with the tiny model and data of conftest. If a recipe stops working as the page says, this file fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.usefixtures("one_thread")

BIN = Path(sys.executable).parent

# The loss module of docs/extending.md, "A new loss" (verbatim).
SCALED_NLL = '''\
"""DPR's softmax NLL times a constant: the smallest loss that is not one of dpr's own."""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, loss_output, score_pool
from dpr.losses.softmax_nll import masked_softmax_nll


class ScaledNLL:
    name = "scaled_nll"

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError(f"loss.scale must be > 0, got {scale}")
        self.scale = float(scale)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        scores, masks = score_pool(q, p, masks, similarity, gather)  # gathers the pool under DDP, checks masks
        return loss_output(self.scale * masked_softmax_nll(scores, masks).mean(), scores, masks)
'''

SCALED_NLL_YAML = """\
# DPR's softmax NLL times `scale` (my_losses/scaled_nll.py)
_target_: my_losses.scaled_nll.ScaledNLL
scale: 1.0
"""


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
    return subprocess.run([str(BIN / "dpr-train"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _quick(tiny_data_dir: Path, out: Path) -> list[str]:
    """A one-step fp32 run without validation or checkpoints: the first step's loss is the starting weights'."""
    return ["data=tiny", f"data_dir={tiny_data_dir}", f"output_dir={out}", "train.max_steps=1", "train.batch_size=4",
            "train.hard_negatives=1", "train.precision=fp32", "train.validate=false", "train.save_every=0",
            "train.warmup_ratio=0"]


def _first_loss(run: Path) -> float:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def test_recipe_new_loss_module_and_yaml_train_the_tiny_model(tiny_model_dir, tiny_data_dir, tmp_path):
    """docs/extending.md "A new loss": a module in the user's own package plus ``conf/loss/<name>.yaml`` in
    the user's config dir; ``loss=<name>`` trains with it and ``loss.<key>=`` reaches its constructor."""
    pkg = tmp_path / "src" / "my_losses"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scaled_nll.py").write_text(SCALED_NLL)
    conf = tmp_path / "myconf"
    (conf / "loss").mkdir(parents=True)
    (conf / "loss" / "scaled_nll.yaml").write_text(SCALED_NLL_YAML)
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
    (conf / "model" / "tiny_cls128.yaml").write_text(textwrap.dedent(f"""\
        # a tiny BERT with CLS pooling, a 16-d projection and e5-style prefixes
        name: {tiny_model_dir}
        shared: false
        pooling: cls
        projection_dim: 16
        similarity: dot
        temperature: 1.0
        question_max_length: 32
        passage_max_length: 64
        question_prefix: "query: "
        passage_prefix: "passage: "
        """))
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


# The recipe module of docs/extending.md, "A new dataset recipe" (verbatim).
FAQ_RECIPE = '''\
"""faq: a TSV of (question, answer, passage) rows as QA data; a seeded tenth of the passages' questions
become dev, another tenth test (split by passage, so no test passage is trained on)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from dpr.data.passages import write_passages
from dpr.data.prepare.common import seeded_split
from dpr.data.qa import QAPair, write_qa_tsv
from dpr.data.retriever_json import make_ctx, write_retriever_json
from dpr.errors import DataError

KIND = "qa"
VERSION = 1
SOURCES: dict[str, str] = {}          # registry names (data/registry.yaml); none: a local file, below
DEFAULTS = {"path": None, "seed": 13, "dev_fraction": 0.1, "test_fraction": 0.1}


def local_sources(cfg: Mapping) -> dict[str, Path]:
    if not cfg.get("path"):
        raise DataError("data config", "the faq recipe needs data.path=<tsv>", field="path")
    return {"faq": Path(str(cfg["path"])).expanduser()}


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    rows = []
    with open(files["faq"], encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.rstrip("\\n").split("\\t")
            if len(parts) != 3 or not all(p.strip() for p in parts):
                raise DataError(files["faq"], "expected question<TAB>answer<TAB>passage", line=lineno)
            rows.append(tuple(p.strip() for p in parts))
    pid = {}
    for _, _, passage in rows:
        pid.setdefault(passage, f"faq-{len(pid)}")
    fractions = {"dev": cfg["dev_fraction"], "test": cfg["test_fraction"],
                 "train": 1.0 - cfg["dev_fraction"] - cfg["test_fraction"]}
    split_of = {p: s for s, ps in seeded_split(sorted(pid.values()), fractions, int(cfg["seed"])).items() for p in ps}
    examples = {"train": [], "dev": [], "test": []}
    for question, answer, passage in rows:
        examples[split_of[pid[passage]]].append({
            "question": question, "answers": [answer], "positive_ctxs": [make_ctx(pid[passage], "", passage)],
            "negative_ctxs": [], "hard_negative_ctxs": []})
    write_passages(out / "passages.tsv", ((i, text, "") for text, i in pid.items()))
    write_retriever_json(out / "train.json", examples["train"])
    write_retriever_json(out / "dev.json", examples["dev"])
    for split in ("dev", "test"):
        write_qa_tsv(out / f"{split}.qa.tsv", [QAPair(e["question"], e["answers"]) for e in examples[split]])
    return {"counts": {"passages": len(pid), "questions": {s: len(e) for s, e in examples.items()}}}
'''


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
    import importlib

    from dpr.data import prepare as prep
    from dpr.data.dataset import DatasetPaths
    from dpr.data.passages import iter_passages
    from dpr.data.qa import read_qa_tsv
    from dpr.data.retriever_json import read_retriever_json
    from dpr.training.trainer import train

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "faq.py").write_text(FAQ_RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    faq = importlib.import_module("faq")
    monkeypatch.setitem(prep.RECIPES, "faq", faq)  # the one line docs/extending.md adds to RECIPES

    source = _write_faq(tmp_path / "faq.tsv")
    cfg = {"name": "myfaq", "recipe": "faq", "kind": "qa", "path": str(source)}
    root = prep.prepare_dataset(cfg, tmp_path / "prepared")
    assert root == tmp_path / "prepared" / "myfaq"
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
    prep.prepare_dataset(cfg, tmp_path / "prepared")  # same recipe, config and source: up to date
    assert (root / "meta.json").stat().st_mtime_ns == stamp
    monkeypatch.setattr(faq, "VERSION", 2)
    prep.prepare_dataset(cfg, tmp_path / "prepared")  # "bump VERSION when its output changes": rebuilt
    assert ds.read_meta()["recipe_version"] == 2

    bad = tmp_path / "bad.tsv"
    bad.write_text("only a question\n")
    from dpr.errors import DataError

    with pytest.raises(DataError, match=r"bad\.tsv:1"):
        prep.prepare_dataset({**cfg, "name": "bad", "path": str(bad)}, tmp_path / "prepared")
    assert not (tmp_path / "prepared" / "bad").exists()  # built aside: nothing half-written

    summary = train({
        "model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {"name": "myfaq", "kind": "qa"}, "logger": {"type": "none"},
        "train": {"batch_size": 4, "hard_negatives": 0, "max_steps": 2, "lr": 1e-3, "warmup_ratio": 0.0,
                  "print_every": 1000, "val_batch_size": 8, "precision": "fp32", "save_every": 0},
        "data_dir": str(tmp_path / "prepared"), "output_dir": str(tmp_path / "run"), "seed": 7,
    })
    assert summary["steps"] == 2 and (tmp_path / "run" / "biencoder.json").is_file()
