#!/usr/bin/env python
"""Print, as JSON, what the code on PYTHONPATH records for each model preset: the pipeline stages' model params and
the biencoder.json config a build saves."""
import json, sys
from hydra import compose, initialize_config_dir
import dpr.cli.pipeline  # noqa
from dpr.cli.common import CONF_DIR
from dpr.training.config import register_schema, without_unset
from dpr.pipeline import _model
from dpr.run_dir import _relevant
from dpr.trainkit.config_dict import plain
from dpr.models import BiEncoderConfig
register_schema()
out = {}
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    for preset in ["minilm", "bert_base", "bge_small", "e5_small", "tiny"]:
        over = [f"model={preset}"] + (["model.name=/x/tiny"] if preset == "tiny" else [])
        cfg = compose(config_name="pipeline", overrides=over)
        m = _model(cfg)
        out[preset] = {"stage_model": m, "saved_config": BiEncoderConfig.from_dict(m).to_dict(),
                       "run_compared": _relevant({"model": plain(cfg.model)})["model"],
                       "stage_train": without_unset(plain(cfg.train), "cpu")}
print(json.dumps(out, indent=1, sort_keys=True))
