"""Two nodes of one process each (torchrun --nnodes=2, rendezvous on localhost) give what one node of two
processes gives: the same losses and final weights from `dpr-train`, the same shards from `dpr-encode` (as one
process writing them all gives).

Global rank (RANK) decides data slices, shard assignment and who writes; LOCAL_RANK only picks the device.
On two nodes both processes have LOCAL_RANK=0, so any use of LOCAL_RANK where RANK belongs would make both
act as rank 0 (the same data slice, two writers) and the runs would differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.run_command import run_command
from tests.system.test_distributed import free_port
from tests.training.test_trainer import _env, dpr_train, write_tiny_data_conf

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TIMEOUT = 240


def console(name: str) -> list[str]:
    """What torchrun launches: the installed console script, else the module (``-m`` for torchrun)."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else ["-m", f"dpr.cli.{name.split('-', 1)[1]}"]


def launch(layout: str, command: list[str], cwd: Path) -> None:
    """Run ``command`` under torchrun as ``layout``: "1x2" (one node, two processes) or "2x1" (two nodes
    of one process, launched as two torchrun agents that meet on 127.0.0.1)."""
    port = f"--master_port={free_port()}"
    if layout == "1x2":
        agents = [[*TORCHRUN, "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1", port]]
    else:
        agents = [[*TORCHRUN, "--nnodes=2", "--nproc_per_node=1", f"--node_rank={r}", "--master_addr=127.0.0.1", port]
                  for r in range(2)]
    procs = []
    for i, agent in enumerate(agents):
        node_cwd = cwd / f"node{i}"
        node_cwd.mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen([*agent, *command], cwd=node_cwd, env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, f"{layout}: {' '.join(command[:2])} failed:\n{out[-3000:]}"


def weights(run: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(run.rglob("*.safetensors")):
        if "checkpoints" not in f.parts:
            out.update({f"{f.relative_to(run)}:{k}": v for k, v in load_file(f).items()})
    return out


@pytest.mark.slow
def test_two_nodes_train_and_encode_like_one_node_of_two(tiny_model_no_dropout, tiny_data_dir, tmp_path):
    conf = write_tiny_data_conf(tmp_path / "conf")
    train = ["--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}", "model=tiny",
             f"model.name={tiny_model_no_dropout}", "train.max_steps=3", "train.batch_size=2", "train.hard_negatives=1",
             "train.precision=fp32", "train.lr=1e-3", "train.val_batch_size=8", "train.warmup_ratio=0.0",
             "train.print_every=1000", "seed=7",
             "threads=1"]  # the same threads in both layouts (the share rule gives 1 per rank on a node of two, 2
             # on a node of one): a thread count changes the float sums' order, not the run
    runs = {}
    for layout in ("1x2", "2x1"):
        run = tmp_path / f"train_{layout}"
        launch(layout, [*dpr_train(), *train, f"output_dir={run}"], tmp_path / f"cwd_train_{layout}")
        runs[layout] = run
    summaries = {lay: json.loads((run / "train_summary.json").read_text()) for lay, run in runs.items()}
    assert summaries["1x2"]["world_size"] == summaries["2x1"]["world_size"] == 2
    rows = {lay: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for lay, run in runs.items()}
    assert [r["step"] for r in rows["2x1"]] == [1, 2, 3]
    assert [r["negatives"] for r in rows["2x1"]] == [7, 7, 7]  # the pool spans both nodes
    assert [r["loss"] for r in rows["2x1"]] == pytest.approx([r["loss"] for r in rows["1x2"]], abs=1e-5)
    w1, w2 = weights(runs["1x2"]), weights(runs["2x1"])
    assert w1.keys() == w2.keys() and len(w1) > 0
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= 1e-5
    # rank 1 (LOCAL_RANK 0 on its own node) wrote nothing where it was started
    assert list((tmp_path / "cwd_train_2x1" / "node1").iterdir()) == []

    # dpr-encode's shards are the same whichever rank writes them: the reference is one process writing all 4 (in
    # this process), the two nodes must write the same 4, two each (as rank 0 both would write shards 0 and 2)
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    encode = [f"model={runs['1x2']}", f"passages={passages}", "num_shards=4", "dtype=float32", "autocast=off",
              "threads=1"]
    shards = {"one": tmp_path / "emb_one", "2x1": tmp_path / "emb_2x1"}
    proc = run_command(["dpr-encode", *encode, f"output_dir={shards['one']}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    launch("2x1", [*console("dpr-encode"), *encode, f"output_dir={shards['2x1']}"], tmp_path / "cwd_encode_2x1")
    names = sorted(p.name for p in shards["2x1"].glob("shard_*"))
    assert len([n for n in names if n.endswith(".json")]) == 4  # both ranks wrote their two shards
    assert names == sorted(p.name for p in shards["one"].glob("shard_*"))
    for name in names:
        a, b = shards["one"] / name, shards["2x1"] / name
        if name.endswith(".npy"):
            assert np.array_equal(np.load(a), np.load(b)), name
        elif name.endswith(".ids.txt"):
            assert a.read_text() == b.read_text(), name
