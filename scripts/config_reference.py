"""Write docs/reference.md, the table of every setting, from the config dataclasses that declare them.

Each setting is declared once, on its dataclass field: its type, its default, its allowed values (`dpr.config.setting`'s
rule or `dpr.config.ranged`'s range) and its doc (the field's comment). This page is generated from those
declarations, never typed by hand, and the suite fails when it is stale:

    python scripts/config_reference.py write   # rewrite docs/reference.md
    python scripts/config_reference.py check   # exit 1 when docs/reference.md is not what the code declares
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import io
import sys
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference.md"

# (the prefix a key is typed with, "module:Class", where the section's keys are read): the order of the page
SECTIONS = (
    ("model.", "dpr.models.biencoder:BiEncoderConfig", "`conf/model/*.yaml` (`dpr-train`, `dpr-pipeline`)"),
    ("model.lora.", "dpr.models.lora:LoraSettings", "LoRA adapters (`model.lora.r=16`; null or `r: 0`: off)"),
    ("train.", "dpr.training.config:TrainConfig", "`conf/train/*.yaml` (`dpr-train`, `dpr-pipeline`)"),
    ("bm25.", "dpr.bm25.config:BM25Config", "the BM25 index (`dpr-bm25` at the root, `dpr-pipeline bm25.`)"),
    ("bm25.", "dpr.negatives.bm25_config:BM25MiningConfig", "BM25 hard-negative mining"),
    ("", "dpr.bm25.config:BM25BuildConfig", "how `dpr-bm25` builds the BM25 index (keys at its root)"),
    ("", "dpr.bm25.config:BM25SearchConfig", "how `dpr-bm25` searches the BM25 index (keys at its root)"),
    ("index.", "dpr.index_config:BuildOptions", "the FAISS index (`dpr-index`, `dpr-pipeline index.`)"),
    ("remine.", "dpr.negatives.config:RemineConfig", "re-mining rounds (`dpr-pipeline train.rounds=N`)"),
    ("encode.", "dpr.encode_config:EncodeConfig", "passage export (`dpr-encode` at the root, `dpr-pipeline encode.`)"),
    ("dense.", "dpr.encode_config:DenseConfig", "the pipeline's dense systems"),
    ("retrieve.", "dpr.retrieval.config:RetrieveConfig", "dense retrieval (`dpr-retrieve` at the root)"),
    ("hybrid.", "dpr.retrieval.fusion:HybridConfig", "hybrid fusion (`dpr-pipeline hybrid.`)"),
    ("eval.", "dpr.eval.config:EvalConfig", "evaluation (`dpr-eval` at the root)"),
    ("bootstrap.", "dpr.eval.config:BootstrapConfig", "bootstrap intervals and paired tests"),
    ("rerank.", "dpr.rerank.config:RerankConfig", "the cross-encoder (`dpr-rerank`; the teacher's: `teacher.rerank.`)"),
    ("rerank.train.", "dpr.rerank.config:RerankTrainConfig", "the cross-encoder's training"),
    ("rerank.score.", "dpr.rerank.config:RerankScoreConfig", "the cross-encoder's scoring"),
    ("teacher.", "dpr.rerank.stage_config:TeacherStageConfig", "the pipeline's teacher (`teacher=true`)"),
    ("reader.train.", "dpr.reader.config:ReaderTrainConfig", "the reader's training (`dpr-reader train`)"),
    ("reader.eval.", "dpr.reader.config:ReaderEvalConfig", "the reader's evaluation (`dpr-reader eval`)"),
    ("", "dpr.launch:LaunchConfig", "`dpr-pipeline`'s processes on one machine (keys at its root)"),
)


def _load(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's comment: the one on its line and the comment lines that continue it (indented past the field),
    else the comment block right above it (a ``# ---`` section heading is not a field's doc)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, tuple[int, str]] = {}  # line -> (column, text)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip())
    lines = source.splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0]
        if name not in names or name in docs or not stripped.startswith(name + ":") or line[:4] != "    " \
                or line[4] == " ":
            continue
        parts: list[str] = []
        if number in comments and comments[number][0] > 4:
            parts.append(comments[number][1])
            following = number + 1
            # comment lines right below, indented past the fields, continue it (a block comment at the fields'
            # indent belongs to the next field)
            while following in comments and lines[following - 1].strip().startswith("#") \
                    and comments[following][0] > 4:
                parts.append(comments[following][1])
                following += 1
        else:
            above = number - 1
            block: list[str] = []
            # a block comment sits at the fields' own indent; one further right continues the field above
            while above in comments and lines[above - 1].strip().startswith("#") and comments[above][0] == 4:
                if comments[above][1].startswith("---"):
                    break
                block.insert(0, comments[above][1])
                above -= 1
            parts = block
        docs[name] = " ".join(p for p in parts if p)
    return docs


def _type_name(tp: Any) -> str:
    """The annotation as written (``int | None``, ``List[float]``)."""
    return tp if isinstance(tp, str) else str(getattr(tp, "__name__", tp)).replace("typing.", "")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return "(section below)"
    return _value(value)


def _value(value: Any) -> str:
    """A value as YAML spells it (null, true, false; strings quoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value).replace("'", "")


def _recorded_before(f: dataclasses.Field) -> str:
    """The note on a key added after runs were recorded (`dpr.config.setting`'s ``recorded_before``): the value a
    record without it stands for, left out of fingerprints while the key holds it."""
    if "recorded_before" not in f.metadata:
        return ""
    name = f.metadata["recorded_as"]
    where = f" (recorded as `{name}`)" if name else ""
    return f"records made before this key existed read as `{_value(f.metadata['recorded_before'])}`{where}"


def _doc(docs: dict[str, str], f: dataclasses.Field) -> str:
    """The field's comment, and the note on a key recorded later (`_recorded_before`)."""
    doc, note = docs.get(f.name, ""), _recorded_before(f)
    if not note:
        return doc
    if not doc:
        return note[0].upper() + note[1:] + "."
    return f"{doc} {note[0].upper() + note[1:]}." if doc.endswith(".") else f"{doc}; {note}."


def _allowed(f: dataclasses.Field) -> str:
    rule = f.metadata.get("rule") or f.metadata.get("range")
    if rule is None:
        return ""
    annotation = _type_name(f.type)
    if "rule" not in f.metadata:  # a schema range: null passes it, and integer-ness is the annotation's
        rule = dataclasses.replace(rule, integer="int" in annotation,
                                   optional="None" in annotation or "Optional" in annotation)
    return ("each item " if f.metadata.get("each") else "") + rule.describe()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    out = ["# Settings reference", "",
           "Every setting of the config dataclasses, generated from their declarations by "
           "`scripts/config_reference.py` (the suite fails when this page is stale): the key as it is typed, its "
           "type, its default, the values it allows (where a range is declared) and what it does. The pages beside "
           "this one explain the settings that need more than a line ([Configuration](configuration.md), "
           "[Backbones](backbones.md)).", ""]
    for prefix, spec, title in SECTIONS:
        cls = _load(spec)
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        heading = f"`{prefix.rstrip('.')}`: {title}" if prefix else title[0].upper() + title[1:]
        out += [f"## {heading}", "", f"`{spec.replace(':', '.')}`", "",
                "| key | type | default | allowed | what it does |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints.get(f.name)):
                continue  # a nested section has its own table
            doc = _doc(docs, f)
            out.append(f"| `{prefix}{f.name}` | {_cell(_type_name(f.type))} | `{_cell(_default(f))}` | "
                       f"{_cell(_allowed(f))} | {_cell(doc)} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["write", "check"])
    args = ap.parse_args(argv)
    text = render()
    if args.action == "write":
        PAGE.write_text(text, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}")
        return 0
    if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
        print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/config_reference.py write", file=sys.stderr)
        return 1
    print(f"{PAGE.relative_to(ROOT)} up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
