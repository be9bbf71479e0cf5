"""DPR's own data as recipes (dpr_nq, dpr_trivia, dpr_squad1) on a tiny copy of DPR's download site: downloads
from a local HTTP server that drops the connection mid-file (resumed with Range), a mirror, the user's own
passage file read in place, and the sha256 ledger that refuses a changed file."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpr.atomic import sha256_file
from dpr.data import download as dl
from dpr.data import ledger
from dpr.data.passages import iter_passages
from dpr.data.prepare import prepare_dataset
from dpr.data.qa import read_qa_tsv
from dpr.data.retriever_json import read_retriever_json
from dpr.errors import DataError
from tests.data.dpr_site import PASSAGES, TEST_QA, published, serve, tsv_bytes, write_mirror, write_site

PSGS = "/wikipedia_split/psgs_w100.tsv.gz"
TEST_CSV = "/data/retriever/nq-test.qa.csv"
DPR_DATA = Path(sys.executable).parent / "dpr-data"


def _cfg(tmp: Path, ds: str = "nq", **over) -> dict:
    return {"name": f"dpr_{ds}", "recipe": f"dpr_{ds}", "kind": "qa", "cache_dir": str(tmp / "cache"),
            "mirror_dir": None, **over}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digests(root: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(root.iterdir()) if p.is_file()}


@pytest.fixture()
def site(tmp_path):
    write_site(tmp_path / "site")
    with serve(tmp_path / "site") as server:
        yield server


def _check_prepared(root: Path, passages_target: Path) -> None:
    assert (root / "passages.tsv").is_symlink() and (root / "passages.tsv").resolve() == passages_target.resolve()
    rows = list(iter_passages(root / "passages.tsv"))
    assert [(r["id"], r["text"], r["title"]) for r in rows] == PASSAGES  # DPR's csv quoting undone
    train = read_retriever_json(root / "train.json")
    assert len(train) == 8 and train[0]["answers"] == ["Honolulu"]  # the padded repeat is gone
    ctx = train[0]["hard_negative_ctxs"][0]
    assert ctx["passage_id"] == "2" and ctx["score"] == 12.5 and ctx["text"] == PASSAGES[1][1]
    assert train[-1]["positive_ctxs"] == []
    assert [p.question for p in read_qa_tsv(root / "dev.qa.tsv")] == [ex["question"] for ex in train[:4]]
    test = read_qa_tsv(root / "test.qa.tsv")
    assert [(p.question, p.answers) for p in test] == [(q, a) for q, a, _ in TEST_QA]
    meta = json.loads((root / "meta.json").read_text())
    assert meta["counts"]["passages"] == len(PASSAGES)
    assert meta["counts"]["questions"] == {"train": 8, "dev": 4, "test": 9}
    assert meta["outputs"]["passages.tsv"]["link"] == str(passages_target.resolve())


def test_download_resumes_after_the_connection_drops(site, tmp_path):
    site.cuts[PSGS] = 200  # the gzip stream stops half-way; the retry asks for the rest
    root = prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    assert [r for p, r in site.requests if p == PSGS] == [None, "bytes=200-"]
    cache = tmp_path / "cache" / "dpr"
    assert (cache / "psgs_w100.tsv").read_bytes() == tsv_bytes()  # gunzipped as it streamed
    assert not list(cache.glob("*.part"))
    _check_prepared(root, cache / "psgs_w100.tsv")
    entry = ledger.entry_of(cache / ledger.LEDGER_NAME, cache / "psgs_w100.tsv")
    gz = published()[PSGS[1:]]
    assert entry["sha256"] == sha256_file(cache / "psgs_w100.tsv") and entry["size"] == len(tsv_bytes())
    assert entry["source"]["sha256"] == _sha(gz) and entry["source"]["size"] == len(gz)


def test_an_interrupted_download_resumes_in_the_next_run(site, tmp_path, monkeypatch):
    monkeypatch.setattr(dl, "ATTEMPTS", 1)
    site.cuts[PSGS] = 150
    with pytest.raises(DataError, match=r"run again to resume") as err:
        prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    assert PSGS in str(err.value) and "\n" not in str(err.value)
    cache = tmp_path / "cache" / "dpr"
    part = cache / "psgs_w100.tsv.gz.part"
    assert part.read_bytes() == published()[PSGS[1:]][:150]  # the compressed bytes kept for the next run
    assert not (cache / "psgs_w100.tsv").exists() and not (tmp_path / "data" / "dpr_nq").exists()
    root = prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    assert [r for p, r in site.requests if p == PSGS] == [None, "bytes=150-"]
    assert (cache / "psgs_w100.tsv").read_bytes() == tsv_bytes() and not part.exists()
    _check_prepared(root, cache / "psgs_w100.tsv")


def test_a_server_that_ignores_range_restarts_from_the_start(site, tmp_path):
    cache = tmp_path / "cache" / "dpr"
    cache.mkdir(parents=True)
    (cache / "nq-test.qa.csv.part").write_bytes(b"garbage from some other file")
    site.ranges = False
    prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    assert (cache / "nq-test.qa.csv").read_bytes() == published()[TEST_CSV[1:]]


def test_a_file_cut_short_for_good_is_refused(tmp_path):
    bad = tmp_path / "cut.gz"
    bad.write_bytes(gzip.compress(tsv_bytes(), mtime=0)[:-30])
    with pytest.raises(DataError, match="ends early"):
        dl.inflate_file(bad, tmp_path / "out.tsv")
    assert not (tmp_path / "out.tsv").exists()
    two = tmp_path / "two.gz"  # concatenated gzip members (pigz, split-and-cat) read as one stream
    two.write_bytes(gzip.compress(b"a\tb\n", mtime=0) + gzip.compress(b"c\td\n", mtime=0))
    assert dl.inflate_file(two, tmp_path / "two.tsv").digest.lines == 2
    assert (tmp_path / "two.tsv").read_bytes() == b"a\tb\nc\td\n"


def test_an_edited_file_is_refused_on_the_next_run(site, tmp_path):
    root = prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    before = _digests(root)
    cached = tmp_path / "cache" / "dpr" / "nq-test.qa.csv"
    edited = cached.read_bytes().replace(b"Paris", b"Lyon!")  # same size: caught by sha256, not size
    cached.write_bytes(edited)
    with pytest.raises(DataError) as err:
        prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    msg = str(err.value)
    assert msg.startswith(str(cached)) and "field 'sha256'" in msg and "nq-test.qa.csv" in msg and "\n" not in msg
    assert "data.sha256.nq-test.qa.csv=" + sha256_file(cached) in msg  # how to accept it, if meant
    assert cached.read_bytes() == edited and _digests(root) == before  # nothing replaced either side
    cached.write_bytes(edited + b"x\t['y']\n")  # another size: refused without hashing
    with pytest.raises(DataError, match="field 'size'"):
        prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    cached.write_bytes(edited)
    # the user accepts the edited version by pinning its digest: the ledger now holds it, the dataset is rebuilt
    accept = {"nq-test.qa.csv": sha256_file(cached)}
    prepare_dataset(_cfg(tmp_path, base_url=site.url, sha256=accept), tmp_path / "data")
    assert "Lyon!" in (root / "test.qa.tsv").read_text()
    prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")  # and later runs accept it unpinned


def test_a_pin_that_does_not_match_is_refused_and_nothing_lands(site, tmp_path):
    wrong = "0" * 64
    with pytest.raises(DataError) as err:
        prepare_dataset(_cfg(tmp_path, base_url=site.url, sha256={"biencoder-nq-dev.json": {"gz": wrong}}),
                        tmp_path / "data")  # the nested form Hydra makes of data.sha256.biencoder-nq-dev.json.gz
    assert "biencoder-nq-dev.json.gz" in str(err.value) and wrong in str(err.value)
    cache = tmp_path / "cache" / "dpr"
    assert not (cache / "biencoder-nq-dev.json").exists() and not (cache / "biencoder-nq-dev.json.gz.part").exists()
    assert not (tmp_path / "data" / "dpr_nq").exists()
    right = {"psgs_w100.tsv": _sha(tsv_bytes()),
             "biencoder-nq-dev.json.gz": _sha(published()["data/retriever/biencoder-nq-dev.json.gz"])}
    prepare_dataset(_cfg(tmp_path, base_url=site.url, sha256=right), tmp_path / "data")
    with pytest.raises(DataError, match="psgs_w100.tsv"):  # a pin on a cached file: checked on reuse too
        prepare_dataset(_cfg(tmp_path, base_url=site.url, sha256={"psgs_w100.tsv": wrong}), tmp_path / "data")


@pytest.mark.parametrize("pins, match", [({"psgs.tsv": "0" * 64}, "no file 'psgs.tsv'"),
                                         ({"psgs_w100.tsv": "abc"}, "not a sha256"),
                                         ("abc", "expected a mapping")])
def test_bad_pins_are_one_line_errors(tmp_path, pins, match):
    with pytest.raises(DataError, match=match):
        prepare_dataset(_cfg(tmp_path, base_url="http://127.0.0.1:9", sha256=pins), tmp_path / "data")


def test_the_users_passage_file_is_read_in_place_and_hashed_once(site, tmp_path, monkeypatch):
    mine = tmp_path / "mine" / "psgs_w100.tsv"
    mine.parent.mkdir()
    mine.write_bytes(tsv_bytes())
    cfg = _cfg(tmp_path, base_url=site.url, passages=str(mine))
    root = prepare_dataset(cfg, tmp_path / "data")
    assert not any(p == PSGS for p, _ in site.requests) and not (tmp_path / "cache" / "dpr" / "psgs_w100.tsv").exists()
    _check_prepared(root, mine)
    hashed = []
    real = ledger.digest_file
    monkeypatch.setattr(ledger, "digest_file", lambda p: hashed.append(Path(p).name) or real(p))
    prepare_dataset(cfg, tmp_path / "data")
    assert hashed == []  # size, mtime and inode unchanged: the recorded digest is used
    os.utime(mine)  # touched, same bytes: hashed again, accepted
    prepare_dataset(cfg, tmp_path / "data")
    assert hashed == ["psgs_w100.tsv"]
    mine.write_bytes(tsv_bytes().replace(b"Honolulu", b"Honolula"))
    with pytest.raises(DataError, match=r"psgs_w100.tsv has sha256") as err:
        prepare_dataset(cfg, tmp_path / "data")
    assert str(err.value).startswith(str(mine.resolve()))
    with pytest.raises(DataError, match="decompressed"):
        gz = tmp_path / "mine" / "psgs_w100.tsv.gz"
        gz.write_bytes(b"")
        prepare_dataset(_cfg(tmp_path, passages=str(gz)), tmp_path / "data2")


def test_mirror_gz_files_are_decompressed_once_plain_ones_read_in_place(tmp_path):
    mirror = write_mirror(tmp_path / "mirror", "trivia")
    cfg = _cfg(tmp_path, "trivia", mirror_dir=str(mirror))
    root = prepare_dataset(cfg, tmp_path / "data")
    cache = tmp_path / "cache" / "dpr"
    _check_prepared(root, cache / "psgs_w100.tsv")  # psg_id (trivia's files) became passage_id
    assert (cache / "trivia-test.qa.csv").is_file()  # trivia's test questions are gzipped
    # a mirror holding the decompressed passages: read there, no copy
    mirror2 = write_mirror(tmp_path / "mirror2", "trivia", decompressed=("psgs_w100.tsv",))
    root = prepare_dataset(_cfg(tmp_path / "two", "trivia", mirror_dir=str(mirror2)), tmp_path / "data")
    _check_prepared(root, mirror2 / "dpr" / "psgs_w100.tsv")
    assert not (tmp_path / "two" / "cache" / "dpr" / "psgs_w100.tsv").exists()
    (mirror2 / "dpr" / "biencoder-trivia-train.json.gz").unlink()
    (tmp_path / "two" / "cache" / "dpr" / "biencoder-trivia-train.json").unlink()
    with pytest.raises(FileNotFoundError, match="biencoder-trivia-train.json.gz"):
        prepare_dataset(_cfg(tmp_path / "two", "trivia", mirror_dir=str(mirror2)), tmp_path / "data")


def test_squad1_recipe(tmp_path):
    mirror = write_mirror(tmp_path / "mirror", "squad1")
    root = prepare_dataset(_cfg(tmp_path, "squad1", mirror_dir=str(mirror)), tmp_path / "data")
    _check_prepared(root, tmp_path / "cache" / "dpr" / "psgs_w100.tsv")


def test_dpr_data_cli_refuses_a_bad_pin_in_one_line(site, tmp_path):
    proc = subprocess.run(
        [str(DPR_DATA), "data=dpr_nq", f"data.base_url={site.url}", f"data.cache_dir={tmp_path / 'cache'}",
         "data.mirror_dir=null", f"data_dir={tmp_path / 'data'}", "+data.sha256.nq-test.qa.csv=" + "ab" * 32],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "nq-test.qa.csv" in lines[0] and "ab" * 32 in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "data" / "dpr_nq").exists()


def test_two_processes_preparing_at_once_download_each_file_once(site, tmp_path):
    """Two ranks (threads here: the writer lock treats them as processes) prepare the same dataset at once:
    the second waits for the first's download instead of fetching the file again."""
    from concurrent.futures import ThreadPoolExecutor

    site.cuts[PSGS] = 200  # slows the first download down (a retry) while the other waits
    cfgs = [_cfg(tmp_path, base_url=site.url, name=f"dpr_nq_{i}") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        roots = list(pool.map(lambda c: prepare_dataset(c, tmp_path / "data"), cfgs))
    gets = [p for p, r in site.requests if r is None]
    assert sorted(gets) == sorted(set(gets)) and len(gets) == 4  # one whole-file request per published file
    for root in roots:
        _check_prepared(root, tmp_path / "cache" / "dpr" / "psgs_w100.tsv")


def test_a_killed_download_resumes_where_it_stopped(site, tmp_path):
    """``dpr-data`` killed (SIGKILL) while the server is part-way through psgs_w100.tsv.gz: the bytes it had are
    on disk, nothing else is; the next run asks for the rest only."""
    site.stalls[PSGS] = 200
    cmd = [str(DPR_DATA), "data=dpr_nq", f"data.base_url={site.url}", f"data.cache_dir={tmp_path / 'cache'}",
           "data.mirror_dir=null", f"data_dir={tmp_path / 'data'}"]
    part = tmp_path / "cache" / "dpr" / "psgs_w100.tsv.gz.part"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (part.is_file() and part.stat().st_size == 200):
            assert proc.poll() is None and time.monotonic() < deadline, "the download never reached the stall"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert part.read_bytes() == published()[PSGS[1:]][:200]
    assert not (tmp_path / "cache" / "dpr" / "psgs_w100.tsv").exists() and not (tmp_path / "data" / "dpr_nq").exists()
    site.stalls.clear()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [r for p, r in site.requests if p == PSGS] == [None, "bytes=200-"]
    assert not part.exists()
    _check_prepared(tmp_path / "data" / "dpr_nq", tmp_path / "cache" / "dpr" / "psgs_w100.tsv")


def test_a_missing_file_on_the_server_is_one_line(site, tmp_path):
    (tmp_path / "site" / TEST_CSV.lstrip("/")).unlink()
    with pytest.raises(DataError, match=r"nq-test.qa.csv: field 'url': download failed \(HTTP 404") as err:
        prepare_dataset(_cfg(tmp_path, base_url=site.url), tmp_path / "data")
    assert "\n" not in str(err.value) and not (tmp_path / "data" / "dpr_nq").exists()


def test_bad_dpr_files_are_one_line_errors_naming_file_and_record(tmp_path):
    mirror = write_mirror(tmp_path / "mirror", decompressed=("psgs_w100.tsv", "biencoder-nq-dev.json"))
    psgs, dev = mirror / "dpr" / "psgs_w100.tsv", mirror / "dpr" / "biencoder-nq-dev.json"
    good = psgs.read_bytes()
    psgs.write_bytes(good.replace(b"id\ttext\ttitle", b"id\ttitle\ttext", 1))
    with pytest.raises(DataError, match=r"psgs_w100.tsv:1: field 'header'"):
        prepare_dataset(_cfg(tmp_path, mirror_dir=str(mirror)), tmp_path / "data")
    psgs.write_bytes(good)
    examples = json.loads(dev.read_text())
    del examples[2]["hard_negative_ctxs"][1]["text"]
    dev.write_text(json.dumps(examples, indent=4))
    with pytest.raises(DataError, match=r"biencoder-nq-dev.json:record 2: field 'hard_negative_ctxs\[1\].text'"):
        prepare_dataset(_cfg(tmp_path / "two", mirror_dir=str(mirror)), tmp_path / "data")
    assert not (tmp_path / "data" / "dpr_nq").exists()
