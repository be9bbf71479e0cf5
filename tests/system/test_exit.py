"""A command under torchrun with gloo leaves its process group at exit, while the interpreter is whole: gloo's
threads otherwise let go of collectives' tensors during shutdown and the process aborts after a successful run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.system.test_distributed import free_port

HERE = Path(__file__).resolve().parent


def test_the_group_is_left_before_the_interpreter_shuts_down(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "exit_worker.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"joined_at_exit": False}
