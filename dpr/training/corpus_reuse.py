"""Corpus vectors handed into and out of a training run, so no one encodes the same corpus twice.

On 2 CPU cores one encoding of squad1_open's 3,526 passages takes ~2 minutes, and the pipeline used to
do it four times for two sets of weights: the untrained export, the trainer's start validation (also the
frozen-index phase's cache), the trainer's last validation, the trained export.

- **In** (``start_vectors``): the corpus encoded with the starting weights (the pipeline's untrained
  system, or the previous round's index). The start validation and the frozen-index phase use it.
  It is checked first: its ids must be the corpus's, in order, and a few passages re-encoded by the
  starting weights must agree with it (else it was encoded by other weights: an error, not a guess).
- **Out** (``on_saved``): the vectors of the weights the run saved (their validation encoded them),
  handed to a callback; the pipeline stores them as the trained model's export
  (:func:`dpr.encode.save_encoded`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

# (ids, vectors [N, D]) of a corpus, or an embeddings directory holding them (read only when used)
CorpusVectors = tuple[Sequence[str], Any] | str | Path
# on_saved(model_dir, ids, vectors, computed_with={"device", "autocast", "max_length"})
OnSaved = Callable[..., Any]

SPOT_CHECK = 8      # passages re-encoded to check the given vectors
TOLERANCE = 2e-2    # max |difference| per component: float16 storage rounds by ~1e-4; other weights differ by ~1e-1


@torch.no_grad()
def check_start_vectors(model, tokenizer, corpus: tuple[list[str], list[str], list[str]], given: CorpusVectors,
                        *, max_length: int, autocast: str, source: str | Path = "start_vectors") -> torch.Tensor:
    """``given`` as a float32 tensor in the corpus's row order, once it is shown to be this model's
    encoding of ``corpus`` (``(ids, texts, titles)``); a ValueError naming ``source`` otherwise (a
    directory ``given`` is read here and names itself)."""
    from dpr.models.encode_options import EncodeOptions
    from dpr.models.inference import encode_texts

    if isinstance(given, (str, Path)):
        from dpr.index.shards import read_embeddings

        source, given = given, read_embeddings(given)
    ids, vectors = list(given[0]), torch.as_tensor(np.asarray(given[1], dtype=np.float32))
    if ids != list(corpus[0]):
        raise ValueError(f"{source}: {len(ids)} vector ids that are not the corpus's {len(corpus[0])} passage ids "
                         "in file order (encoded from another passages file?)")
    if vectors.ndim != 2 or vectors.shape[0] != len(ids):
        raise ValueError(f"{source}: vectors of shape {list(vectors.shape)} for {len(ids)} ids")
    n = min(SPOT_CHECK, len(ids))
    was_training = model.training
    model.eval()
    try:
        fresh = encode_texts(model, tokenizer, corpus[1][:n], "passage",
                             EncodeOptions(batch_size=n, max_length=max_length, autocast=autocast),
                             titles=corpus[2][:n]).float().cpu()
    finally:
        model.train(was_training)
    if fresh.shape[1] != vectors.shape[1]:
        raise ValueError(f"{source}: {vectors.shape[1]}-d vectors for a {fresh.shape[1]}-d model")
    diff = float((fresh - vectors[:n]).abs().max()) if n else 0.0
    if diff > TOLERANCE:
        raise ValueError(f"{source}: the first {n} passages' vectors differ from the starting weights' encoding "
                         f"by up to {diff:.3g} (> {TOLERANCE}): encoded by other weights")
    return vectors
