"""An index is one output of three files (``index.faiss``, ``.ids``, ``.json``): a build killed between their
moves leaves files of two builds, which the reader refuses in one line instead of searching them (before, the
old vectors were searched under the new ids, exit 0). An index saved before its metadata named its files still
loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from dpr.errors import DataError
from dpr.index import load_index, read_index_meta, save_index
from dpr.index.storage import file_fingerprint, ids_path, meta_path
from tests.run_command import run_command
from tests.system.test_faults import _env, _run_stopped_at


def _embeddings(root: Path, seed: int, n: int = 400, dim: int = 32) -> Path:
    from dpr.index.shards import write_shard

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    ids = [f"p{j}" for j in rng.permutation(n)]  # another build: other vectors, the ids in another order
    write_shard(root, 0, 1, x, ids)
    return root


def _index(tmp_path: Path, emb: Path, out: Path) -> None:
    """``dpr-index`` run whole, in this process (the killed build below is a real process)."""
    proc = run_command(["dpr-index", f"embeddings={emb}", "index=flat", f"output={out}"], cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("nth, moved", [(1, "index.faiss.ids"), (2, "index.faiss")])
def test_a_build_killed_between_the_moves_is_refused_by_the_reader(tmp_path, nth, moved, tiny_model_dir):
    out = tmp_path / "idx" / "index.faiss"
    _index(tmp_path, _embeddings(tmp_path / "a", 0), out)
    load_index(out)  # the first build is whole
    stopped = _run_stopped_at("dpr.atomic:replace_path", f"after-{nth}", "dpr.cli.index:main",
                              [f"embeddings={_embeddings(tmp_path / 'b', 1)}", "index=flat", f"output={out}"], tmp_path)
    assert f"{moved}'" in stopped  # killed just after this file of the new build was moved in, before the rest
    with pytest.raises(DataError, match="files of two builds") as err:
        load_index(out)
    assert "\n" not in str(err.value)
    # the command that searches it (in this process): one line, exit 2, no traceback
    (tmp_path / "p.tsv").write_text("id\ttext\ttitle\n" + "".join(f"p{i}\tpassage {i}\t\n" for i in range(400)))
    (tmp_path / "q.tsv").write_text("what is passage 3?\t['passage 3']\n")
    proc = run_command(["dpr-retrieve", f"model={tiny_model_dir}", f"index={out}", f"passages={tmp_path / 'p.tsv'}",
                        f"qa={tmp_path / 'q.tsv'}", f"output={tmp_path / 'r.json'}"], cwd=tmp_path, env=_env())
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-retrieve")]
    assert proc.returncode == 2 and len(lines) == 1 and "files of two builds" in lines[0], proc.stderr[-3000:]
    assert not (tmp_path / "r.json").exists()
    _index(tmp_path, tmp_path / "b", out)  # the same command again: whole again
    from dpr.index.shards import list_shards

    assert load_index(out)[1] == list(list_shards(tmp_path / "b")[0].ids())


def test_metadata_names_both_files_and_an_older_index_still_loads(tmp_path):
    import faiss

    index = faiss.IndexFlatIP(8)
    index.add(np.eye(8, dtype=np.float32))
    out = tmp_path / "i.faiss"
    save_index(index, [f"d{i}" for i in range(8)], out)
    files = read_index_meta(out)["files"]
    assert files == {"index": file_fingerprint(out), "ids": file_fingerprint(ids_path(out))}
    meta = json.loads(meta_path(out).read_text())
    del meta["files"]  # as saved before the metadata named its files
    meta_path(out).write_text(json.dumps(meta))
    assert load_index(out)[1] == [f"d{i}" for i in range(8)]


def test_the_fingerprint_samples_large_files_and_sees_a_changed_block(tmp_path):
    p = tmp_path / "big"
    data = bytearray(os.urandom(4 << 20))
    p.write_bytes(data)
    before = file_fingerprint(p)
    data[(4 << 20) * 10 // 65] ^= 1  # inside one of the sampled blocks
    p.write_bytes(data)
    assert file_fingerprint(p) != before and file_fingerprint(p)["bytes"] == 4 << 20
