"""The passages file is hashed once per version: later calls (other processes) read the digest from the cache,
a touched or edited file is hashed again, and the digest is the file's sha256 either way."""

from __future__ import annotations

import hashlib
import os

import pytest

from dpr.index import fingerprint, hash_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DPR_HASH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hash_cache, "MIN_CACHED_BYTES", 0)
    reads = []
    real = hash_cache.hash_file
    monkeypatch.setattr(hash_cache, "hash_file", lambda p: reads.append(str(p)) or real(p))
    return reads


def _fresh_process_fingerprint(path):
    fingerprint._memo.clear()  # what a new process starts with
    return fingerprint.passages_fingerprint(path)


def test_second_process_does_not_reread(cache, tmp_path):
    p = tmp_path / "passages.tsv"
    p.write_text("id\ttext\ttitle\n1\tsome text\tT\n")
    want = "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
    assert _fresh_process_fingerprint(p) == want
    assert len(cache) == 1
    assert _fresh_process_fingerprint(p) == want
    assert len(cache) == 1, "the digest was not taken from the cache"


def test_touched_or_edited_file_is_hashed_again(cache, tmp_path):
    p = tmp_path / "passages.tsv"
    p.write_text("id\ttext\ttitle\n1\tone\tT\n")
    first = _fresh_process_fingerprint(p)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: same bytes
    assert _fresh_process_fingerprint(p) == first
    assert len(cache) == 2
    # a rewrite (new bytes, new mtime) is hashed again
    p.write_text("id\ttext\ttitle\n1\ttwo\tT\n")
    assert _fresh_process_fingerprint(p) == "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() != first
    assert len(cache) == 3


def test_unwritable_cache_still_hashes(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    monkeypatch.setenv("DPR_HASH_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(hash_cache, "MIN_CACHED_BYTES", 0)
    p = tmp_path / "f.bin"
    p.write_bytes(b"abc" * 1000)
    assert hash_cache.cached_sha256(p) == hashlib.sha256(p.read_bytes()).hexdigest()


def test_small_files_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DPR_HASH_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "config.json"
    p.write_text("{}")
    hash_cache.cached_sha256(p)
    assert not (tmp_path / "cache").exists()
