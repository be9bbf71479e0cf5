"""A trained run directory → a sentence-transformers model directory (loads offline with
``SentenceTransformer(<dir>)``).

The modules reproduce `dpr.models.BiEncoder` exactly: the tower's ``Transformer`` (its own tokenizer
and maximum lengths; for ``pooling: eos`` a copy whose template appends EOS, `dpr.export.eos_template`), ``Pooling``
(``cls``, ``mean`` or ``lasttoken`` for ``last`` / ``eos``, as trained), a bias-carrying linear ``Dense``
without activation when the run has a projection, and ``Normalize`` for cosine similarity.

- Separate towers: a ``Router`` with a ``query`` route (question tower, question max length) and a
  ``document`` route (passage tower, passage max length): ``model.encode_query(questions)`` and
  ``model.encode_document(passages)`` go through their own tower. Plain ``encode`` takes the document
  route.
- A shared tower: one ``Transformer`` whose ``query_length`` / ``document_length`` carry the two
  maximum lengths (so ``encode_query`` / ``encode_document`` cut as training did); optional
  ``prompts`` are stored for users who want them.
- A run trained with prefixes (``model.question_prefix`` / ``passage_prefix``) exports them as the
  ``query`` / ``document`` prompts, which ``encode_query`` / ``encode_document`` apply (before a pair's
  first segment, the title, as training did).

``dim`` (Matryoshka): stored as the copy's ``truncate_dim`` (``config_sentence_transformers.json``, read back by
``SentenceTransformer(<dir>)``), so ``encode*`` return each vector's first ``dim`` coordinates. sentence-transformers
cuts after the model's ``Normalize``: for a cosine model ``normalize_embeddings=True`` gives dpr's re-normalised
vectors (`dpr.models.truncate`), and ``model.similarity`` (cosine) ranks the same either way (the card says so).

Passages trained with titles are encoded as the pair ``(title, text)`` (``[CLS] title [SEP] text
[SEP]``, DPR's input); ``encode_document`` takes such tuples, and a passage without a title is its
text alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from dpr.atomic import atomic_path, check_replaceable
from dpr.errors import DataError
from dpr.export.marker import owned_by, write_marker

log = logging.getLogger(__name__)

SIMILARITY_FN = {"cosine": "cosine", "dot": "dot"}


def _tower_modules(tower_dir: Path, config: Any, projection: Any, shared: bool) -> list:
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer

    qlen, plen = config.question_max_length, config.passage_max_length
    transformer = Transformer(str(tower_dir), max_seq_length=max(qlen, plen) if shared else None,
                              query_length=qlen, document_length=plen)
    if not shared:
        # each route's own length also for callers that bypass encode_query/encode_document
        transformer.max_seq_length = qlen if tower_dir.name.startswith("question") else plen
    if config.pooling == "eos":  # EOS appended by the tokenizer's own template, as dpr's EosTokenizer appends it
        from dpr.export.eos_template import with_eos_template

        lengths = [qlen, plen] if shared else [transformer.max_seq_length]
        transformer.processor = with_eos_template(transformer.tokenizer, lengths, str(tower_dir))
    # sentence-transformers' name for last-token pooling; eos is last-token pooling over inputs ending in EOS
    pooling = {"last": "lasttoken", "eos": "lasttoken"}.get(config.pooling, config.pooling)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
    if projection is not None:
        import torch

        modules.append(Dense(projection.in_features, projection.out_features, bias=True,
                             activation_function=torch.nn.Identity(),
                             init_weight=projection.weight.detach().clone(),
                             init_bias=projection.bias.detach().clone()))
    return modules


def build_sentence_transformer(run_dir: str | Path, prompts: Mapping[str, str] | None = None,
                               dim: int | None = None) -> Any:
    """The `SentenceTransformer` equivalent of the run directory ``run_dir`` (in memory, CPU); ``dim``: its
    ``truncate_dim`` (module doc; larger than the model's vectors: a ValueError naming both sizes)."""
    try:
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Router
    except ImportError as err:
        raise ImportError(f"the sentence-transformers export needs sentence-transformers>=6.2 "
                          f"(pip install 'dpr[export]'): {err}") from None

    from dpr.models import is_biencoder_dir, load_biencoder
    from dpr.models.run_format import model_marker, plain_tower_dirs

    run_dir = Path(run_dir)
    if not is_biencoder_dir(run_dir):
        raise FileNotFoundError(f"{run_dir}: not a trained run directory (no {model_marker(run_dir).name})")
    model, _ = load_biencoder(run_dir)  # validates the run and gives the projection weights
    from dpr.models.truncate import check_dim

    dim = check_dim(dim, int(model.dim), f"the run {run_dir}")
    config = model.config
    trained = {name: text for name, text in (("query", config.question_prefix), ("document", config.passage_prefix))
               if text}
    for name, text in trained.items():
        if prompts and name in prompts and prompts[name] != text:
            raise ValueError(f"prompt {name!r}={prompts[name]!r}: the run was trained with {text!r} there")
    with plain_tower_dirs(run_dir, model) as towers:  # a LoRA run's adapters merged (modules load them in memory)
        if config.shared:
            modules = _tower_modules(towers["question"], config, model.question_projection, shared=True)
        else:
            modules = [Router.for_query_document(
                query_modules=_tower_modules(towers["question"], config, model.question_projection, shared=False),
                document_modules=_tower_modules(towers["passage"], config, model.passage_projection, shared=False),
            )]
    if not config.shared and prompts and set(prompts) - set(trained):
        raise ValueError("prompts are for a shared tower; separate towers already route queries and passages")
    if config.similarity == "cosine":
        modules.append(Normalize())
    return SentenceTransformer(modules=modules, device="cpu", prompts={**(prompts or {}), **trained} or None,
                               similarity_fn_name=SIMILARITY_FN[config.similarity], truncate_dim=dim)


def export_sentence_transformers(run_dir: str | Path, output: str | Path, *,
                                 prompts: Mapping[str, str] | None = None, report: str | Path | None = None,
                                 card: bool = True, dim: int | None = None, **card_options: Any) -> Path:
    """Write ``run_dir`` as a sentence-transformers directory at ``output`` (built aside, renamed
    into place), with the model card (`dpr.model_card.write_model_card`) as its ``README.md``; ``dim``: the
    copy's ``truncate_dim`` (Matryoshka, module doc), stated on the card."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise DataError(output, "exists and is not a directory", field="output")
    if Path(run_dir).resolve().is_relative_to(output.resolve()):
        # the export replaces output as a whole: never over the run it is made from
        raise DataError(output, f"would replace the run directory {run_dir} it exports", field="output")
    from dpr.models.run_format import output_dim
    from dpr.models.truncate import check_dim

    check_dim(dim, output_dim(run_dir), f"the run {run_dir}")  # from its JSON files: before any weight loads
    owned = owned_by(run_dir)  # an export of this run (again) may be replaced; anything else is refused first
    check_replaceable(output, directory=True, owned=owned)
    st = build_sentence_transformer(run_dir, prompts=prompts, dim=dim)
    with atomic_path(output, owned=owned) as tmp:
        st.save(str(tmp), create_model_card=False)
        write_marker(tmp, run_dir, "sentence-transformers")
        if card:
            from dpr.model_card import write_model_card

            write_model_card(tmp, report=report, run_dir=run_dir, truncate_dim=st.truncate_dim, **card_options)
    log.info("exported %s as sentence-transformers to %s", run_dir, output)
    return output
