"""A tiny copy of DPR's download site, in DPR's own formats, and a local HTTP server for it.

`write_site(root)` writes, deterministically (gzip with mtime 0), the files DPR publishes under the paths of its
download list: ``wikipedia_split/psgs_w100.tsv.gz`` (header ``id text title``, csv-quoted fields where DPR's
writer quotes them), ``data/retriever/biencoder-<ds>-{train,dev}.json.gz`` (DPR's indented JSON with ``score``
/``title_score``; ``psg_id`` instead of ``passage_id`` for trivia) and ``<ds>-test.qa.csv[.gz]`` (question, tab,
a Python list). `serve(root)` serves a folder over HTTP on 127.0.0.1 with ``Range`` support, and can drop
the connection part-way through a file.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

from tests.conftest import TINY_PASSAGES, TINY_QA

# DPR's ids are the row numbers of psgs_w100.tsv; the ninth passage has quotes, which DPR's csv writer escapes
PASSAGES = [(str(i), text, title) for i, (_, text, title) in enumerate(TINY_PASSAGES, 1)] + [
    (str(len(TINY_PASSAGES) + 1), 'Shakespeare, the "Bard of Avon", wrote "Hamlet"', "William Shakespeare"),
]
PID = {old: str(i) for i, (old, _, _) in enumerate(TINY_PASSAGES, 1)}
QA = [(q, a, PID[p]) for q, a, p in TINY_QA]
TEST_QA = QA + [('who wrote "hamlet"', ["William Shakespeare", "Shakespeare"], PID["p1"])]


def tsv_bytes() -> bytes:
    out = io.StringIO()
    w = csv.writer(out, delimiter="\t", lineterminator="\n")  # DPR wrote psgs_w100.tsv with csv
    w.writerow(["id", "text", "title"])
    w.writerows(PASSAGES)
    return out.getvalue().encode()


def _ctx(pid: str, id_key: str, score: float) -> dict:
    _, text, title = PASSAGES[int(pid) - 1]
    return {"title": title, "text": text, "score": score, "title_score": 0, id_key: pid}


def biencoder_bytes(qa: list, id_key: str = "passage_id") -> bytes:
    n = len(PASSAGES)
    examples = []
    for i, (q, answers, pid) in enumerate(qa):
        others = [str((int(pid) + d - 1) % n + 1) for d in (1, 2, 3)]
        examples.append({
            "dataset": "tiny",
            "question": q,
            "answers": answers + [f" {answers[0]} "],  # a padded repeat: stripped and de-duplicated when prepared
            "positive_ctxs": [_ctx(pid, id_key, 1000)],
            "negative_ctxs": [_ctx(others[2], id_key, 0)],
            "hard_negative_ctxs": [_ctx(others[0], id_key, 12.5), _ctx(others[1], id_key, 11.0)],
        })
    examples[-1]["positive_ctxs"] = []  # DPR's dev files hold questions without a positive
    return json.dumps(examples, indent=4, ensure_ascii=False).encode()


def qa_csv_bytes(qa: list) -> bytes:
    out = io.StringIO()
    csv.writer(out, delimiter="\t", lineterminator="\n").writerows([q, str(a)] for q, a, _ in qa)
    return out.getvalue().encode()


def published(ds: str = "nq") -> dict[str, bytes]:
    """``{path under the site: bytes as published}`` of one dataset (gzip where DPR gzips)."""
    id_key = "psg_id" if ds == "trivia" else "passage_id"
    qa_name = f"data/retriever/{ds}-test.qa.csv" + (".gz" if ds == "trivia" else "")
    plain = {
        "wikipedia_split/psgs_w100.tsv.gz": tsv_bytes(),
        f"data/retriever/biencoder-{ds}-train.json.gz": biencoder_bytes(QA, id_key),
        f"data/retriever/biencoder-{ds}-dev.json.gz": biencoder_bytes(QA[:4], id_key),
        qa_name: qa_csv_bytes(TEST_QA),
    }
    return {k: gzip.compress(v, mtime=0) if k.endswith(".gz") else v for k, v in plain.items()}


def write_site(root: Path, ds: str = "nq") -> dict[str, bytes]:
    files = published(ds)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def write_mirror(root: Path, ds: str = "nq", decompressed: tuple[str, ...] = ()) -> Path:
    """``<root>/dpr/<published name>``; names in ``decompressed`` are stored gunzipped, without ``.gz``."""
    folder = root / "dpr"
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in published(ds).items():
        name = rel.rsplit("/", 1)[-1]
        if name.endswith(".gz") and name[:-3] in decompressed:
            (folder / name[:-3]).write_bytes(gzip.decompress(data))
        else:
            (folder / name).write_bytes(data)
    return root


class _Handler(BaseHTTPRequestHandler):
    server: "SiteServer"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        path = self.server.root / self.path.lstrip("/")
        rng = self.headers.get("Range")
        self.server.requests.append((self.path, rng))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and self.server.ranges:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        stall = self.server.stalls.get(self.path)
        if stall is not None and start < stall:
            self.wfile.write(body[: stall - start])
            self.wfile.flush()
            self.server.release.wait(60)  # holds the connection open, sending nothing more
            return
        cut = self.server.cuts.get(self.path)
        if cut is not None and start < cut:
            self.server.cuts.pop(self.path)  # once: the retry gets the rest
            self.wfile.write(body[: cut - start])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-file
            self.close_connection = True
            return
        self.wfile.write(body)


class SiteServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self.cuts: dict[str, int] = {}  # url path -> byte offset where the connection drops (once)
        self.stalls: dict[str, int] = {}  # url path -> byte offset where the server stops sending (until release)
        self.release = threading.Event()
        self.ranges = True  # False: a server that ignores Range (always 200, whole file)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def serve(root: Path) -> Iterator[SiteServer]:
    server = SiteServer(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
