"""The cross-encoder teacher inside ``dpr-pipeline … teacher=true``: train it, score the training
candidates with it, distil the dual encoder from those scores, and rerank each first stage's top K.

Stages (the pipeline's :class:`~dpr.stages.StageRunner`: skipped when up to date), in run order:

- ``teacher_train`` → ``<out>/teacher/cross_encoder/`` (`dpr.rerank.train`), validated by reranking
  BM25's dev top ``teacher_cfg.rerank.score.k``; skipped altogether when ``teacher_cfg.model`` names a
  trained cross-encoder.
- ``teacher_scores`` → ``<out>/teacher/teacher_scores.jsonl`` + ``.json`` manifest
  (`dpr.training.teacher_scores.score_candidates`), only when distilling or denoising. The file lives
  under the run, not beside the data: runs with different teachers share a prepared dataset, and a
  scores file beside it would be stale for all but one. It runs after ``bm25_mine``, which rewrites
  train.json in place, so both the stage's fingerprint and the manifest's sha256 are of the mined file.
- the pipeline's ``train`` then distils (``teacher_cfg.loss`` replaces the ``loss`` group,
  ``train.teacher_scores`` points at the file, the file is one of the stage's inputs). With
  ``train.rounds > 1`` each re-mined round's candidates are scored too (``teacher_scores_round<r>`` →
  ``<out>/rounds/round<r>/teacher_scores.jsonl``), denoised and distilled from in the same way.
- ``rerank_hybrid_dev`` (the hybrid's dev lists, fused with the dev-tuned weight), ``rerank_dev`` (every
  depth of ``teacher_cfg.k_grid`` for every first stage on dev → ``<out>/rerank/dev.json``; K = the smallest
  depth within ``teacher_cfg.k_tolerance`` of the best dev MRR (QA) / nDCG@10 (qrels), each depth with its
  interpolation weight of ``teacher_cfg.weight_grid`` tuned on dev: `dpr.rerank.runs.reranked`) and ``rerank_<system>`` for bm25, dense and
  hybrid (→ ``<out>/rerank/<system>/test.json`` in DPR's results format, ``test.trec`` on qrels data,
  ``stats.json`` with the seconds per question). A first stage whose dev figure reranking lowers keeps its own
  list as its row (``teacher_cfg.keep_first_stage``; decided from dev.json, so no dev scoring is redone). These
  rerank stages live in `dpr.rerank.rerank_stages`.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dpr.data.dataset import DatasetPaths
from dpr.rerank.rerank_stages import FIRST_STAGES, SUFFIX, StageTexts, dev_qrels, rerank_stages, stage_config
from dpr.rerank.stage_config import TeacherStageConfig
from dpr.stages import StageRunner
from dpr.trainkit.config_dict import plain

log = logging.getLogger(__name__)

# re-exported: the pipeline and its tests import the rerank stages from here, beside the teacher's
__all__ = ["FIRST_STAGES", "SUFFIX", "TeacherRun", "check_teacher", "distill_config", "rerank_stages", "run_teacher",
           "score_training_candidates", "scores_stage", "stage_config"]


def check_teacher(cfg: DictConfig) -> TeacherStageConfig:
    """The teacher settings, checked before any stage runs: ranges, the distillation loss and a given
    cross-encoder directory."""
    tcfg = stage_config(cfg)
    if tcfg.model:
        from dpr.rerank.model import resolve_dir

        resolve_dir(tcfg.model)  # one line when it is not a cross-encoder directory
    if tcfg.distill:
        _distill_loss(tcfg)
    return tcfg


@dataclass
class TeacherRun:
    """What the pipeline's training and rerank stages take from the teacher stages."""

    teacher_dir: Path                  # the cross-encoder directory
    train_cfg: DictConfig              # the pipeline config the dense training runs with
    train_inputs: list[Path] = field(default_factory=list)  # extra inputs of the train stage (the scores file)
    notes: dict = field(default_factory=dict)
    tcfg: TeacherStageConfig | None = None  # set when the training reads teacher scores (distill / denoise)

    def round_scores(self, stages: StageRunner):
        """For ``train.rounds > 1``: ``(r, train_file, round_dir) -> scores file``, the teacher's scores of a
        re-mined round's candidates (stage ``teacher_scores_round<r>``, cached like the first), or None
        when the training reads no scores."""
        if self.tcfg is None:
            return None

        def run(r: int, train_file: Path, round_dir: Path) -> Path:
            scores = scores_stage(stages, f"teacher_scores_round{r}", self.teacher_dir, train_file, round_dir, self.tcfg)
            self.notes.setdefault("round_scores", {})[str(r)] = str(scores)
            return scores

        return run


def run_teacher(cfg: DictConfig, ds: DatasetPaths, out: Path, stages: StageRunner, bm25_dev: Path) -> TeacherRun:
    """The ``teacher_train`` and ``teacher_scores`` stages; returns the config the dense model trains with."""
    tcfg = check_teacher(cfg)
    rcfg = tcfg.rerank
    texts = StageTexts(ds)
    if tcfg.model:
        from dpr.rerank.model import resolve_dir

        teacher_dir = resolve_dir(tcfg.model)  # one line when it is not a cross-encoder directory
    else:
        from dpr.rerank.train import train_cross_encoder

        tout = out / "teacher"
        teacher_dir = tout / "cross_encoder"
        stages.run(
            "teacher_train",
            # the stage runs only when its inputs or settings changed: the run there is the pipeline's own
            lambda: train_cross_encoder(rcfg, ds.train, tout, dev=texts.records(bm25_dev),
                                        dev_qrels=dev_qrels(ds, "dev"), overwrite=True),
            outputs=[teacher_dir / "cross_encoder.json"],
            inputs=[ds.train, bm25_dev, *texts.inputs(), *([ds.qrels("dev")] if ds.has_qrels else [])],
            params={"rerank": rcfg.as_dict()},
        )
    notes: dict = {"cross_encoder": str(teacher_dir), "trained_here": not tcfg.model, "distilled": tcfg.distill,
                   "loss": tcfg.loss if tcfg.distill else None, "denoise": tcfg.denoises}
    if not tcfg.needs_scores:
        return TeacherRun(teacher_dir, cfg, [], notes)

    scores = scores_stage(stages, "teacher_scores", teacher_dir, ds.train, out / "teacher", tcfg)
    notes["scores"] = str(scores)
    if tcfg.denoises:
        notes["denoise_margin"] = tcfg.denoise_margin
    return TeacherRun(teacher_dir, distill_config(cfg, tcfg, scores), [scores], notes, tcfg)


def scores_stage(stages: StageRunner, name: str, teacher_dir: Path, train_json: Path, out_dir: Path,
                 tcfg: TeacherStageConfig) -> Path:
    """The stage ``name`` writing the teacher's scores of ``train_json``'s candidates into
    ``out_dir/teacher_scores.jsonl`` (skipped when up to date); returns that path."""
    from dpr.training.teacher_scores import SCORES_FILE, manifest_path

    scores = out_dir / SCORES_FILE
    stages.run(name, lambda: score_training_candidates(teacher_dir, train_json, scores, tcfg),
               outputs=[scores, manifest_path(scores)], inputs=[train_json, teacher_dir],
               params={"max_negatives": tcfg.max_negatives, "precision": tcfg.rerank.score.precision})
    return scores


def score_training_candidates(teacher_dir: Path, train_json: Path, scores: Path, tcfg: TeacherStageConfig) -> dict:
    """``score_candidates`` with the cross-encoder as the scorer. The stage only runs when something it
    depends on changed, so a finished file made for another teacher or data is rescored, not refused."""
    from dpr.errors import DataError
    from dpr.index.fingerprint import model_fingerprint
    from dpr.rerank.model import document_text, load_cross_encoder
    from dpr.rerank.score import score_pairs
    from dpr.trainkit.precision import resolve_precision
    from dpr.training.teacher_scores import score_candidates

    model, tok, settings = load_cross_encoder(teacher_dir)  # on the one device rule's device
    s = tcfg.rerank.score
    precision = resolve_precision(s.precision, next(model.parameters()).device)
    fingerprint = f"cross-encoder:{model_fingerprint(teacher_dir)}:{precision}"

    def scorer(questions, ctxs):
        docs = [document_text(c.get("title") or "", c["text"], tok, bool(settings["title"])) for c in ctxs]
        return score_pairs(model, tok, questions, docs, batch_size=s.batch_size, autocast=s.precision,
                           max_length=int(settings["max_length"])).tolist()

    kwargs = dict(teacher_fingerprint=fingerprint, max_negatives=tcfg.max_negatives, chunk_size=tcfg.chunk_size)
    try:
        return score_candidates(scorer, train_json, scores, **kwargs)
    except DataError as err:
        if err.field not in ("teacher", "data", "candidates"):
            raise
        log.info("%s: %s; rescoring", scores, err.message)
        return score_candidates(scorer, train_json, scores, overwrite=True, **kwargs)


def distill_config(cfg: DictConfig, tcfg: TeacherStageConfig, scores: Path) -> DictConfig:
    """``cfg`` with the training reading ``scores``: the ``loss`` group replaced by ``teacher_cfg.loss``
    (+ ``loss_args``) and ``train.hard_negatives`` by ``teacher_cfg.hard_negatives`` when distilling, and
    the teacher's denoising settings."""
    new = copy.deepcopy(cfg)
    OmegaConf.set_struct(new, False)
    if tcfg.distill:
        new.loss = _distill_loss(tcfg)
    new.train.teacher_scores = str(scores)
    if tcfg.distill and tcfg.hard_negatives > 0:
        new.train.hard_negatives = int(tcfg.hard_negatives)
    new.train.teacher_denoise = tcfg.denoises
    new.train.teacher_denoise_margin = float(tcfg.denoise_margin)
    return new


def config_dirs() -> list[Path]:
    """Where the running command finds its config groups, in Hydra's search order (the package's ``conf/`` and a
    user's ``--config-dir``: `HydraConfig`'s config sources), then the package's ``conf/`` (a Python caller)."""
    from dpr.resources import conf_dir

    dirs: list[Path] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            dirs = [Path(src.path) for src in HydraConfig.get().runtime.config_sources
                    if src.schema == "file" and src.path]
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return [*dirs, conf_dir()]


def _distill_loss(tcfg: TeacherStageConfig) -> DictConfig:
    """``loss/<teacher_cfg.loss>.yaml`` of the config search path (a ``--config-dir`` loss too, as for ``loss=``)
    with ``loss_args`` merged in; refused unless it learns from scores."""
    from dpr.losses import build_loss

    dirs = config_dirs()
    path = next((d / "loss" / f"{tcfg.loss}.yaml" for d in dirs if (d / "loss" / f"{tcfg.loss}.yaml").is_file()), None)
    if path is None:
        known = sorted({p.stem for d in dirs for p in (d / "loss").glob("*.yaml")})
        where = ", ".join(str(d / "loss") for d in dict.fromkeys(dirs))
        raise ValueError(f"teacher_cfg.loss={tcfg.loss!r}: no {tcfg.loss}.yaml in {where}; known: {', '.join(known)}")
    base = OmegaConf.load(path)
    # the kind of loss first (the default loss_args are kl_distill's and mean nothing to a loss without a teacher)
    if getattr(build_loss(plain(base)), "teacher", None) != "scores":
        raise ValueError(f"teacher_cfg.loss={tcfg.loss!r} does not learn from a teacher's scores "
                         "(its class declares no teacher = \"scores\"); use kl_distill or margin_mse")
    loss = OmegaConf.merge(base, OmegaConf.create(dict(tcfg.loss_args)))
    build_loss(plain(loss))  # the arguments, checked before any stage runs
    return loss
