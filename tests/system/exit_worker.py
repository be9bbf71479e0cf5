"""One rank of tests/system/test_exit.py (torchrun, gloo): a DDP model, a collective on a tensor Python holds, a
barrier, then a plain return with the group still joined, as a command ends. A handler registered before the group
is joined runs after dpr's own at exit and records whether the group had been left by then."""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from dpr import distributed as D  # noqa: E402


def record(out: Path, rank: str) -> None:
    (out / f"rank{rank}.json").write_text(json.dumps({"joined_at_exit": tdist.is_initialized()}))


def main() -> None:
    out = Path(sys.argv[1])
    atexit.register(record, out, os.environ["RANK"])  # registered first, so it runs after init_distributed's
    assert D.init_distributed()
    net = DistributedDataParallel(torch.nn.Linear(16, 1))
    net(torch.randn(4, 16)).sum().backward()
    big = torch.ones(2**22)
    tdist.all_reduce(big)  # its work, holding `big`, is let go by a gloo thread
    del net
    D.barrier()


if __name__ == "__main__":
    main()
