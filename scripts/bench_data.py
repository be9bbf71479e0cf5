"""Where the benchmarks find their corpus: a prepared dataset, else one prepared from the mirror into a temp dir."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench")


def find_dataset(data_dir: Path, name: str, prefix: str = "bench_") -> Path:
    root = data_dir / name
    if (root / "passages.tsv").is_file():
        return root
    from dpr.data.prepare import prepare_dataset

    mirror = os.environ.get("DPR_DATA_MIRROR") or str(REPO.parent / "shared" / "data")
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    log.info("%s not prepared under %s: preparing it into %s", name, data_dir, tmp)
    try:
        return prepare_dataset({"name": name}, tmp, mirror_dir=mirror if Path(mirror).is_dir() else None)
    except BaseException:  # an unknown name, no mirror: no empty temp dir left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
