"""Synthetic corpora for `bench_scale.py`: passages and vectors that look like a real corpus' own.

- `PassageSampler`: passages whose word counts are drawn from the real passages' lengths and whose
  words are drawn from the real corpus' unigram distribution (whitespace tokens, case kept), each
  with a real title. BM25 then sees a vocabulary, document-length spread and term-frequency profile
  like the real corpus', only without topical structure.
- `gaussian_like`: distractor vectors from a Gaussian with the real vectors' mean and covariance,
  unit-normalised when the real ones are (cosine models), else rescaled to real norms.
- `mix_order`: a seeded permutation that hides the real rows among the synthetic ones, so neither
  BM25's tie-break (lower row first) nor IVF training favours them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np


class PassageSampler:
    """Draws synthetic passages with the word and length statistics of ``texts``."""

    def __init__(self, texts: Sequence[str], titles: Sequence[str], seed: int = 0) -> None:
        counts = Counter(w for t in texts for w in t.split())
        if not counts:
            raise ValueError("the real passages hold no words to sample from")
        self.words = np.array(list(counts), dtype=object)
        freq = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        self.cdf = np.cumsum(freq / freq.sum())
        self.lengths = np.array([max(1, len(t.split())) for t in texts], dtype=np.int64)
        self.titles = list(titles) or [""]
        self.rng = np.random.default_rng(seed)

    def sample(self, n: int) -> tuple[list[str], list[str]]:
        """``n`` (texts, titles); one vectorised draw of all words, then one join per passage."""
        lengths = self.lengths[self.rng.integers(0, len(self.lengths), n)]
        # inverse-CDF sampling: searchsorted is ~3x faster than rng.choice(p=...) for 100M draws
        picks = np.searchsorted(self.cdf, self.rng.random(int(lengths.sum())), side="right")
        picks = np.minimum(picks, len(self.words) - 1)
        words = self.words[picks].tolist()
        ends = np.cumsum(lengths).tolist()
        texts, start = [], 0
        for end in ends:
            texts.append(" ".join(words[start:end]))
            start = end
        titles = [self.titles[i] for i in self.rng.integers(0, len(self.titles), n).tolist()]
        return texts, titles


def gaussian_like(real: np.ndarray, n: int, seed: int = 0, batch: int = 131_072) -> np.ndarray:
    """``n`` float32 vectors ~ N(mean, cov) of ``real``, normalised like ``real``.

    The covariance is factored by its eigendecomposition (negative round-off eigenvalues clipped), so
    it may be singular (fewer real vectors than dimensions, as in the tests).
    """
    real = np.asarray(real, dtype=np.float64)
    mean = real.mean(axis=0)
    cov = np.cov(real, rowvar=False) if len(real) > 1 else np.eye(real.shape[1]) * 1e-2
    vals, vecs = np.linalg.eigh(np.atleast_2d(cov))
    factor = (vecs * np.sqrt(np.clip(vals, 0.0, None))).T.astype(np.float32)  # z @ factor ~ N(0, cov)
    norms = np.linalg.norm(real, axis=1)
    unit = bool(np.allclose(norms, 1.0, atol=1e-2))
    rng = np.random.default_rng(seed)
    out = np.empty((n, real.shape[1]), dtype=np.float32)
    for s in range(0, n, batch):
        m = min(batch, n - s)
        x = rng.standard_normal((m, real.shape[1]), dtype=np.float32) @ factor + mean.astype(np.float32)
        target = 1.0 if unit else norms[rng.integers(0, len(norms), m)][:, None]
        out[s:s + m] = x / np.linalg.norm(x, axis=1, keepdims=True) * target
    return out


def mix_order(n_total: int, seed: int) -> np.ndarray:
    """Row ``i`` of the mixed corpus is item ``order[i]`` of (real items, then synthetic ones)."""
    return np.random.default_rng(seed).permutation(n_total)


def iter_rows(order: np.ndarray, ids: Sequence[str], texts: Sequence[str],
              titles: Sequence[str]) -> Iterator[dict[str, str]]:
    """The mixed corpus as `dpr.bm25.build_index_from_rows` rows, built lazily (no second copy)."""
    for j in order.tolist():
        yield {"id": ids[j], "text": texts[j], "title": titles[j]}


def tiny_model(out: Path) -> Path:
    """A random 2-layer, 32-dim BERT with MiniLM's tokenizer (the test suite's tiny model)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from dpr.models.hub import default_model_path

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(default_model_path())
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=256)).save_pretrained(out)
    tok.save_pretrained(out)
    return out
