"""One torchrun worker: the pipeline's corpus encode (`dpr.pipeline_encode.encode_on_every_rank`), recording which
shards this rank encoded in ``<out>/rank<r>.json``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from pathlib import Path

from dpr.encode_config import EncodeConfig
from dpr.pipeline_encode import encode_on_every_rank


class Encoded(logging.Handler):
    """Collects the "shard i/n: <count> passages" lines `dpr.encode` logs for each shard it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.shards: list[list[int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = re.match(r"shard (\d+)/(\d+): \d+ passages", record.getMessage())
        if m:
            self.shards.append([int(m.group(1)), int(m.group(2))])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--passages", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    handler = Encoded()
    logger = logging.getLogger("dpr.encode")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    emb = Path(args.out) / "embeddings"
    encode_on_every_rank(args.model, Path(args.passages), emb,
                         EncodeConfig(dtype="float32", autocast="off", runtime="torch"), poll_s=0.2)
    # every rank returns only once the whole corpus is there
    finished = sorted(p.name for p in emb.glob("shard_*.json"))
    rank = int(os.environ["RANK"])
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps({"encoded": handler.shards, "finished": finished}))


if __name__ == "__main__":
    main()
