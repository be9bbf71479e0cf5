"""``dpr-pipeline data=dpr_nq`` end to end on a tiny copy of DPR's download site (served on localhost): the files
are downloaded, prepared, trained on with the tiny model and evaluated; a re-run after one of the downloaded
files was edited is refused by its sha256, in one line naming the file, and leaves the run as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dpr.atomic import sha256_file
from tests.data.dpr_site import TEST_QA, serve, write_site
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent


def _pipeline(url: str, tmp: Path, model: Path) -> subprocess.CompletedProcess:
    cmd = [
        str(BIN / "dpr-pipeline"), "data=dpr_nq", f"data.base_url={url}", f"data.cache_dir={tmp / 'cache'}",
        "data.mirror_dir=null", f"data_dir={tmp / 'data'}", f"output_dir={tmp / 'run'}", f"model.name={model}",
        "model.shared=false", "model.pooling=cls", "model.similarity=dot", "model.temperature=1.0",
        "train.max_steps=4", "train.batch_size=4", "train.hard_negatives=1", "train.save_every=0",
        "train.val_max_questions=4", "train.lr=1e-3", "train.frozen_steps=2", "bm25.num_negatives=3",
        "retrieve.k=5", "encode.batch_size=4",
    ]
    # in this process (the site is served by a thread of it): the run is about what is fetched, checked and written
    return run_as_subprocess(cmd, env={**os.environ, "WANDB_MODE": "disabled", "DPR_DATA_MIRROR": ""})


def test_dpr_nq_downloaded_prepared_trained_evaluated_then_an_edit_refused(tiny_model_dir, tmp_path):
    write_site(tmp_path / "site")
    with serve(tmp_path / "site") as site:
        proc = _pipeline(site.url, tmp_path, tiny_model_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]
        report_file = tmp_path / "run" / "eval" / "report.json"
        report = json.loads(report_file.read_text())
        assert report["num_questions"] == len(TEST_QA)
        assert {"bm25", "dense"} <= set(report["systems"])
        # every question's answer is in the 9-passage corpus: BM25's top-5 finds most of them
        assert report["systems"]["bm25"]["top_k"]["5"] >= 0.5
        assert (tmp_path / "run" / "dense" / "test.json").is_file()
        assert (tmp_path / "data" / "dpr_nq" / "passages.tsv").is_symlink()
        before = sha256_file(report_file)
        served = len(site.requests)

        cached = tmp_path / "cache" / "dpr" / "psgs_w100.tsv"
        cached.write_bytes(cached.read_bytes().replace(b"Paris", b"Pariz"))  # an edit of the same size
        proc = _pipeline(site.url, tmp_path, tiny_model_dir)
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        assert len(errors) == 1 and str(cached) in errors[0] and "sha256" in errors[0], proc.stderr[-3000:]
        assert sha256_file(report_file) == before and len(site.requests) == served  # nothing re-run or re-fetched
