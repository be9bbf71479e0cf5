"""One rank of a launch running an every-rank stage (`dpr.stages.StageRunner`), for tests/test_stages_every_rank.py:
``python stage_rank_worker.py <run dir> <seconds before writing> <record_wait_s>``; the rank, world size and launch
come from the environment, as a launcher sets them. Every rank writes the same output file; prints what happened as
JSON."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpr.atomic import write_text_atomic  # noqa: E402
from dpr.stages import StageOutputsChanged, StageRunner  # noqa: E402


def main() -> None:
    run, delay, wait = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    out = run / "out.txt"

    def write() -> None:
        time.sleep(delay)
        write_text_atomic(out, "the same in every rank\n")

    try:
        ran = StageRunner(run / "stages", record_wait_s=wait).run("every", write, outputs=[out], params={"k": 1})
        print(json.dumps({"ran": ran}))
    except StageOutputsChanged as err:
        print(json.dumps({"refused": str(err)}))


if __name__ == "__main__":
    main()
