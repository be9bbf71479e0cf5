"""dpr-export's settings: ExportConfig is the one source of its defaults and its schema; bad values are one line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import dpr.cli.export  # noqa: F401  registers export_cfg/default
from dpr.cli.common import CONF_DIR
from dpr.export.config import ExportConfig
from tests.run_command import run_as_subprocess


def test_the_composed_config_is_the_dataclass_defaults():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="export"), resolve=False)
    cfg.pop("hydra", None)
    assert cfg == dataclasses.asdict(ExportConfig())  # nothing restated in conf/export.yaml, nothing missing


@pytest.mark.parametrize("override,needle", [
    ("check=maybe", "config key check:"),
    ("format=onnx", "format must be one of sentence-transformers; got 'onnx'"),
    ("bogus=1", "bogus"),
    (None, "config key model_path: required"),
])
def test_bad_settings_are_one_line_naming_the_key(tmp_path, override, needle):
    args = [f"output={tmp_path / 'out'}"] + ([f"model={tmp_path}", override] if override else [])
    proc = run_as_subprocess([sys.executable, "-m", "dpr.cli.export", *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("dpr-export: error:") and needle in lines[0], lines
    assert not (tmp_path / "out").exists()  # refused before anything is written
