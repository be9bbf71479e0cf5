"""The run directory's format, known here alone: the rest of dpr asks these functions, never for a file name.

A saved bi-encoder directory::

    out_dir/
      question_encoder/       HF save_pretrained (safetensors) + tokenizer: AutoModel/AutoTokenizer load it;
                              with LoRA (``model.lora``) the adapters alone (peft's adapter_config.json +
                              adapter_model.safetensors) + tokenizer: the base is ``config.name``
      passage_encoder/        the same for the passage tower (a copy of the question tower when shared)
      projection.safetensors  only with a projection: question.{weight,bias} [, passage.{weight,bias}]
      biencoder.json          {"format": "dpr.biencoder", "version": 1, "config": BiEncoderConfig
                               [, "base_fingerprint": sha256 of the LoRA base's files]}

Recorded runs from before the backbone keys existed read unchanged (those keys absent mean their defaults).

The cross-encoder's and the reader's directories (:data:`CROSS_ENCODER`, :data:`READER`) are laid out here too::

    cross_encoder/            (inside a dpr-rerank train output directory)
      encoder/                the one-label sequence classifier and tokenizer (with LoRA: adapters and head)
      cross_encoder.json      the input settings it was trained with [, base_model, lora, base_fingerprint]
    reader/                   (inside a dpr-reader train output directory)
      encoder/                the encoder and tokenizer
      reader_head.safetensors the span and relevance heads
      reader.json             the windowing settings it was trained with
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterator

CONFIG_FILE = "biencoder.json"
PROJECTION_FILE = "projection.safetensors"
QUESTION_DIR = "question_encoder"
PASSAGE_DIR = "passage_encoder"
TOWER_DIRS = {"question": QUESTION_DIR, "passage": PASSAGE_DIR}
FORMAT = "dpr.biencoder"
FORMAT_VERSION = 1
# What saving a model writes into a run directory (a training run's own files are dpr.run_dir's).
MODEL_FILES = (CONFIG_FILE, QUESTION_DIR, PASSAGE_DIR, PROJECTION_FILE)


@dataclass(frozen=True)
class ModelDirLayout:
    """A saved model directory other than the bi-encoder's: its settings file (the marker: written last), the folder
    of its Hugging Face encoder, and the folder a training command saves it in inside its output directory."""

    kind: str            # the model's name in messages: "cross-encoder", "reader"
    config_file: str
    final_dir: str
    trained_by: str      # the command that trains one
    encoder_dir: str = "encoder"

    def is_dir(self, path: str | Path) -> bool:
        """True for such a directory, or a training output directory holding one."""
        path = Path(path)
        return (path / self.config_file).is_file() or (path / self.final_dir / self.config_file).is_file()

    def resolve(self, path: str | Path) -> Path:
        """The model directory itself, given it or a training output directory holding it; FileNotFoundError
        (one line, naming the command that makes one) for anything else."""
        path = Path(path)
        if not (path / self.config_file).is_file() and (path / self.final_dir / self.config_file).is_file():
            path = path / self.final_dir
        if not (path / self.config_file).is_file():
            raise FileNotFoundError(f"{path}: not a {self.kind} directory (no {self.config_file}; train one with "
                                    f"{self.trained_by})")
        return path


CROSS_ENCODER = ModelDirLayout("cross-encoder", "cross_encoder.json", "cross_encoder", "dpr-rerank train")
READER = ModelDirLayout("reader", "reader.json", "reader", "dpr-reader train")
READER_HEADS = "reader_head.safetensors"
# sentence-transformers applies a sigmoid to a one-label model's logit unless its config names another activation:
# a saved cross-encoder's config names Identity, so CrossEncoder.predict returns the logit our scoring returns.
ST_ACTIVATION = "torch.nn.modules.linear.Identity"


def model_marker(run_dir: str | Path) -> Path:
    """The file whose presence makes ``run_dir`` a loadable model, written last when saving; it stands for the
    model as a pipeline stage's input or output (its content records the architecture)."""
    return Path(run_dir) / CONFIG_FILE


def model_outputs(run_dir: str | Path) -> list[Path]:
    """What a stage that trains a model into ``run_dir`` produces (the marker and the passage tower)."""
    return [model_marker(run_dir), Path(run_dir) / PASSAGE_DIR]


def tower_dir(run_dir: str | Path, tower: str) -> Path:
    """The folder of ``tower`` ("question" or "passage") in a run directory."""
    return Path(run_dir) / TOWER_DIRS[tower]


def is_run_dir(path: str | Path) -> bool:
    """True for a directory written by `dpr.models.save_biencoder`."""
    return model_marker(path).is_file()


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def recorded_config(run_dir: str | Path) -> dict:
    """The run's recorded config as a plain dict, unvalidated ({} when unreadable): for cheap questions that load
    nothing (`output_dim`); `dpr.models.read_biencoder_config` validates."""
    config = _read_json(model_marker(run_dir)).get("config")
    return config if isinstance(config, dict) else {}


def output_dim(model_path: str | Path) -> int | None:
    """The vector size a local model produces, from its JSON files alone (no weights loaded): a run's projection
    size, else its question tower's (or its LoRA base's) hidden size, else a plain HF directory's; None if unknown."""
    path = Path(str(model_path))
    if not path.is_dir():
        return None
    config = recorded_config(path)
    if config.get("projection_dim"):
        return int(config["projection_dim"])
    candidates = [tower_dir(path, "question"), path]
    if config.get("lora") and config.get("name"):
        from dpr.models.hub import resolve_model_name

        candidates.insert(1, Path(resolve_model_name(str(config["name"]))))
    for folder in candidates:
        hidden = _read_json(folder / "config.json").get("hidden_size")
        if isinstance(hidden, int):
            return hidden
    return None


def tokenizer_dir(name: str, tower: str) -> str:
    """Where the tokenizer of ``tower`` of model ``name`` (an alias, a hub name, a run or HF directory) lives."""
    from dpr.models.hub import resolve_model_name

    path = resolve_model_name(name)
    sub = tower_dir(path, tower)
    return str(sub) if sub.is_dir() else path  # a run dir: each tower has its tokenizer


@contextlib.contextmanager
def plain_tower_dirs(run_dir: str | Path, model: Any) -> Iterator[dict[str, Path]]:
    """Folders a plain ``transformers.AutoModel`` / ``AutoTokenizer`` loads each tower from: the run's own for a
    run without adapters; for a LoRA run, a temporary copy of each tower with its adapters merged into the base
    (`dpr.models.lora.merged_copy`), removed on exit. ``model`` is the loaded run (`load_biencoder`)."""
    from dpr.models.lora import is_lora, merged_copy

    towers = {"question": model.question_encoder, "passage": model.passage_encoder}
    # a decoder's copy pads on the right: sentence-transformers passes no position ids, so only right padding
    # gives it the positions the towers were trained with
    if not any(is_lora(t) for t in towers.values()) and not getattr(model, "decoder", False):
        yield {name: tower_dir(run_dir, name) for name in towers}
        return
    from dpr.models.backbone import load_tokenizer

    with tempfile.TemporaryDirectory(prefix="dpr-merged-") as tmp:
        out = {}
        for name, tower in towers.items():
            folder = Path(tmp) / TOWER_DIRS[name]
            merged_copy(tower).save_pretrained(str(folder))
            tok = load_tokenizer(tower_dir(run_dir, name), "mean", "right", decoder=False)
            tok.save_pretrained(str(folder))
            out[name] = folder
        yield out


def usage_note(lora: bool = False) -> str:
    """The model card's sentence on loading the towers without dpr."""
    if lora:
        return (f"`{QUESTION_DIR}/` and `{PASSAGE_DIR}/` hold LoRA adapters: `peft.PeftModel.from_pretrained` puts "
                "them on the base model named in `biencoder.json`; ")
    return f"`{QUESTION_DIR}/` and `{PASSAGE_DIR}/` load with `transformers.AutoModel`; "
