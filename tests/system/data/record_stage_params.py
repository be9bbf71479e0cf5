#!/usr/bin/env python
"""Print, as JSON, the parameters every stage of dpr-pipeline records for the tiny dataset and model with the
default config (and the systems its report holds), as the code on PYTHONPATH runs them. Paths under the temporary
directory read ``<tmp>``. Used by tests/system/test_pipeline_dims.py against ``default_stage_params.json``, which
this script wrote on the code before ``dense.dim`` / ``dense.dims`` (commit a7f7796)."""
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer, BertConfig, BertModel

sys.path.append(str(Path(__file__).resolve().parents[3]))  # tests.conftest, after PYTHONPATH (the code recorded)
import dpr.cli.pipeline  # noqa: F401,E402  (registers the config groups)
from dpr.cli.common import CONF_DIR  # noqa: E402
from dpr.models.hub import default_model_path  # noqa: E402
from dpr.pipeline import run_pipeline  # noqa: E402
from dpr.stages import StageRunner  # noqa: E402
from tests.conftest import write_tiny_dataset  # noqa: E402

os.environ["WANDB_MODE"] = "disabled"
recorded: dict = {}
original = StageRunner.run


def run(self, name, fn, *, outputs, inputs=(), params=None, **how):
    recorded[name] = params  # what a stage records; ``how`` (which ranks run it) is not recorded
    return original(self, name, fn, outputs=outputs, inputs=inputs, params=params, **how)


StageRunner.run = run
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(default_model_path())
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=256)).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    write_tiny_dataset(root / "data" / "tiny")
    overrides = ["data.name=tiny", "data.kind=qa", "data.recipe=none", f"data_dir={root / 'data'}",
                 f"output_dir={root / 'run'}", f"model.name={root / 'model'}", "model.shared=false",
                 "train.max_steps=2", "train.batch_size=4", "train.hard_negatives=1", "train.save_every=0",
                 "train.val_max_questions=4", "bm25.num_negatives=3", "retrieve.k=5", "encode.batch_size=4",
                 *sys.argv[1:]]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="pipeline", overrides=overrides)
    report = run_pipeline(cfg)
    text = json.dumps({"stages": recorded, "systems": list(report["systems"])}, indent=1, sort_keys=True,
                      default=str)
    print(text.replace(str(root), "<tmp>"))
