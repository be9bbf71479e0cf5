"""The FAISS factory strings this project builds, parsed and checked before FAISS sees them.

FAISS aborts the whole process on some strings (``HNSW0``: an assertion, exit 134; ``HNSW1`` a
segfault; ``PQ8x0`` a floating-point exception), so `build_index` only hands it a string this parser
accepted with every parameter in range:

    Flat                      exact search
    HNSW<M>[,Flat]            graph, M neighbours per node, 2 <= M <= 256
    IVF<nlist>,Flat           inverted lists, nlist >= 1 (and <= the training vectors)
    [OPQ<m>[_<d>],]IVF<nlist>,PQ<m>[x<bits>]
                              lists + product quantization: m >= 1 divides the dimension (after OPQ:
                              d), 1 <= bits <= 16 (default 8; needs 2**bits training vectors)

``<nlist>`` may be ``{nlist}`` and a PQ/OPQ ``<m>`` may be ``{m}``: filled from the data (`dpr.index.build`).
Anything else is refused with one line listing these forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUPPORTED = "Flat, HNSW<M>[,Flat], IVF<nlist>,Flat, [OPQ<m>[_<d>],]IVF<nlist>,PQ<m>[x<bits>]"
HNSW_M_RANGE = (2, 256)
PQ_BITS_RANGE = (1, 16)

_NUM = r"(\d+|\{%s\})"
_FORMS = {
    "flat": re.compile(r"Flat"),
    "hnsw": re.compile(r"HNSW(\d+)(?:,Flat)?"),
    "ivf_flat": re.compile(r"IVF" + _NUM % "nlist" + r",Flat"),
    "ivf_pq": re.compile(r"(?:OPQ" + _NUM % "m" + r"(?:_(\d+))?,)?IVF" + _NUM % "nlist" + r",PQ" + _NUM % "m"
                         + r"(?:x(\d+))?"),
}


@dataclass(frozen=True)
class FactorySpec:
    """A parsed factory string; numbers are None where the string holds a placeholder."""

    text: str
    kind: str                  # flat | hnsw | ivf_flat | ivf_pq
    hnsw_m: int | None = None
    nlist: int | None = None
    pq_m: int | None = None
    pq_bits: int = 8
    opq_m: int | None = None
    opq_d: int | None = None
    has_opq: bool = False

    def placeholders(self) -> set[str]:
        return set(re.findall(r"\{(\w+)\}", self.text))


def _num(text: str | None) -> int | None:
    return None if text is None or text.startswith("{") else int(text)


def _refuse(factory: str, why: str) -> ValueError:
    return ValueError(f"index.factory {factory!r}: {why}")


def parse_factory(factory: object) -> FactorySpec:
    """Parse (not yet fill) a factory string; ValueError (one line) for a form or a number out of range."""
    if not isinstance(factory, str):
        raise TypeError(f"index.factory must be a string, got {type(factory).__name__} {factory!r}")
    text = factory.strip()
    kind, match = next(((k, m) for k, rx in _FORMS.items() if (m := rx.fullmatch(text))), (None, None))
    if match is None:
        raise _refuse(factory, f"not a supported form; supported: {SUPPORTED}")
    if kind == "flat":
        return FactorySpec(text, kind)
    if kind == "hnsw":
        m = int(match.group(1))
        lo, hi = HNSW_M_RANGE
        if not lo <= m <= hi:
            raise _refuse(factory, f"HNSW M={m} must be in [{lo}, {hi}]")
        return FactorySpec(text, kind, hnsw_m=m)
    if kind == "ivf_flat":
        spec = FactorySpec(text, kind, nlist=_num(match.group(1)))
    else:
        opq_m, opq_d, nlist, pq_m, bits = match.groups()
        spec = FactorySpec(text, kind, nlist=_num(nlist), pq_m=_num(pq_m), pq_bits=int(bits) if bits else 8,
                           opq_m=_num(opq_m), opq_d=int(opq_d) if opq_d else None, has_opq=opq_m is not None)
        lo, hi = PQ_BITS_RANGE
        if not lo <= spec.pq_bits <= hi:
            raise _refuse(factory, f"PQ bits={spec.pq_bits} must be in [{lo}, {hi}]")
        for name, v in (("PQ m", spec.pq_m), ("OPQ m", spec.opq_m), ("OPQ d", spec.opq_d)):
            if v is not None and v < 1:
                raise _refuse(factory, f"{name}={v} must be >= 1")
    if spec.nlist is not None and spec.nlist < 1:
        raise _refuse(factory, f"IVF nlist={spec.nlist} must be >= 1")
    return spec


def check_filled(spec: FactorySpec, dim: int, train_count: int) -> None:
    """The constraints that need the data: PQ/OPQ m divides the dimension, enough training vectors."""
    factory = spec.text
    if spec.placeholders():
        raise _refuse(factory, f"placeholders {sorted(spec.placeholders())} left unfilled")
    if spec.kind == "ivf_pq":
        d = dim
        if spec.has_opq:
            d = spec.opq_d or dim
            if d % spec.opq_m:
                raise _refuse(factory, f"OPQ m={spec.opq_m} must divide its output dimension {d}")
        if d % spec.pq_m:
            raise _refuse(factory, f"PQ m={spec.pq_m} must divide the dimension {d}")
        if train_count < 2 ** spec.pq_bits:
            raise _refuse(factory, f"{spec.pq_bits}-bit PQ needs at least {2 ** spec.pq_bits} training vectors, "
                          f"have {train_count}; use fewer bits (PQ{spec.pq_m}x4) or index=flat")
    if spec.nlist is not None and spec.nlist > train_count:
        raise _refuse(factory, f"{spec.nlist} IVF lists but only {train_count} training vectors")
