"""What this CPU can do natively: its flags, bf16 support and whether it has AVX-512.

Every ``auto`` precision choice (training, validation, encoding, the reader, the benchmarks' rows) asks
:func:`cpu_supports_bf16`, so two switches decide which rule ``auto`` follows on any machine:

- ``DPR_NO_BF16=1`` answers False: the "CPU without bf16" rule (fp32) on a machine that has bf16.
- ``DPR_FORCE_BF16=1`` answers True: the bf16 rule on a machine without native bf16. A test switch: torch
  then emulates bf16 matmuls (exact in what it computes, several times slower than fp32), so the suite's
  precision-dependent tests (``pytest -m precision``) run under both rules on every CPU (``.ci/run``).

Setting both is a contradiction and an error.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

NO_BF16_ENV = "DPR_NO_BF16"
FORCE_BF16_ENV = "DPR_FORCE_BF16"


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


def _switch(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def bf16_rule_forced() -> bool | None:
    """What the switches force ``auto`` to: False (``DPR_NO_BF16``), True (``DPR_FORCE_BF16``) or None."""
    no, force = _switch(NO_BF16_ENV), _switch(FORCE_BF16_ENV)
    if no and force:
        raise ValueError(f"{NO_BF16_ENV} and {FORCE_BF16_ENV} are both set: choose one precision rule for auto")
    return False if no else True if force else None


def cpu_supports_bf16() -> bool:
    """True when this CPU has native bf16 matmuls (AVX512-BF16 or AMX); emulated bf16 is slower than fp32.

    ``DPR_NO_BF16`` / ``DPR_FORCE_BF16`` (a non-empty value other than 0) override the answer (module doc).
    """
    forced = bf16_rule_forced()
    if forced is not None:
        return forced
    return cpu_has_native_bf16()


@functools.lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """What the hardware says, whatever the switches: AVX512-BF16 or AMX tiles, through torch's probes."""
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
