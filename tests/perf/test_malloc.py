"""glibc malloc tuning for CPU training (dpr/perf/malloc.py): freed big blocks are reused, not faulted in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "dpr" / "perf" / "malloc.py"

# Loads the module by path (no torch import: a fresh process in ~0.1 s), applies it, then allocates, touches
# and frees a 64 MiB block twice: the second round's minor page faults show whether the block was reused.
PROBE = f"""
import ctypes, importlib.util, json
spec = importlib.util.spec_from_file_location("malloc_probe", {str(MODULE)!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
applied = m.keep_freed_memory()
again = m.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults():
    return int(open("/proc/self/stat").read().split()[9])
size = 64 << 20
rounds = []
for _ in range(2):
    before = faults()
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
    rounds.append(faults() - before)
print(json.dumps({{"applied": applied, "again": again, "faults": rounds}}))
"""

glibc_linux = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                                 reason="glibc only")


def _probe(setting: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DPR_MALLOC_TUNING"}
    if setting is not None:
        env["DPR_MALLOC_TUNING"] = setting
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@glibc_linux
def test_tuned_malloc_reuses_a_freed_big_block_without_faulting_it_in_again():
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    tuned = _probe(None)
    assert tuned["applied"] and tuned["again"]
    assert tuned["faults"][0] > pages // 2        # the first round faults the block in
    assert tuned["faults"][1] < pages // 20       # the second reuses it
    plain = _probe("0")
    assert not plain["applied"] and not plain["again"]
    assert plain["faults"][1] > pages // 2        # glibc's default: mmap, munmap, fault in again


RELEASE_PROBE = f"""
import ctypes, importlib.util, json
spec = importlib.util.spec_from_file_location("malloc_probe", {str(MODULE)!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon:")) * 1024
blocks = [libc.malloc(1 << 20) for _ in range(256)]  # a peak heap of 256 MiB, touched
for p in blocks:
    ctypes.memset(p, 1, 1 << 20)
keep = libc.malloc(64)  # something still in use above it: the freed pages are in the heap's middle
for p in blocks:
    libc.free(p)
kept = anon()
released = m.release_freed_memory()
print(json.dumps({{"kept": kept, "after": anon(), "released": released}}))
"""


@glibc_linux
def test_released_memory_leaves_the_resident_set():
    got = json.loads(subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True,
                                    check=True).stdout)
    assert got["released"] is True
    assert got["kept"] - got["after"] > 200 << 20  # the freed 256 MiB kept by the tuning, then given back
