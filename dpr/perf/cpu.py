"""What this CPU can do natively: its flags, bf16 support and whether it has AVX-512.

``DPR_NO_BF16=1`` makes :func:`cpu_supports_bf16` answer False, so the "CPU without bf16" path (every
``auto`` precision choice, the benchmarks' rows) can be exercised on a machine that has it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

NO_BF16_ENV = "DPR_NO_BF16"


@functools.lru_cache(maxsize=1)
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo``, sorted; empty where the file is absent (macOS)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return ()
    for line in text.splitlines():
        if line.startswith("flags"):
            return tuple(sorted(set(line.split(":", 1)[1].split())))
    return ()


def cpu_supports_bf16() -> bool:
    """True when this CPU has native bf16 matmuls (AVX512-BF16 or AMX); emulated bf16 is slower than fp32.

    False whenever ``DPR_NO_BF16`` is set to a non-empty value other than 0.
    """
    if os.environ.get(NO_BF16_ENV, "") not in ("", "0"):
        return False
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        fn = getattr(torch.cpu, probe, None)
        if fn is not None:
            try:
                if fn():
                    return True
            except Exception:  # private probes; absence of support is the safe answer
                continue
    return False


def cpu_has_avx512() -> bool:
    """True when torch's CPU kernels run with AVX-512 here (``torch.backends.cpu.get_cpu_capability()``).

    The ``auto`` encode runtime needs it: ONNX Runtime's fp32 kernels beat torch's with AVX-512 (1.6x on a
    Zen 4 EPYC) and do not without it (0.96x on a Zen 3 EPYC with AVX2 only; README "Benchmarks").
    """
    try:
        return str(torch.backends.cpu.get_cpu_capability()).upper().startswith("AVX512")
    except Exception:  # an older torch without the probe: no evidence either way, keep torch
        return False
