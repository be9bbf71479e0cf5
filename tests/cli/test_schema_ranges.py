"""Property test over the command schemas (dpr/cli/schemas.py): every numeric key of every command (the
``train`` and ``model`` groups aside: dpr.training / dpr.models check their own) refuses zero, negative,
NaN, inf, huge and wrongly typed values with one line naming the key, or accepts a legal value, and for
the cheap commands (fusion, BM25) an accepted value runs to a finite result."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import tempfile
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf, open_dict

from dpr.cli.common import CONF_DIR
from dpr.cli.schemas import SCHEMAS, check_config

from tests.conftest import TINY_PASSAGES

SKIP_GROUPS = ("train.", "model.")
# the values a schema must have an answer for (plus hypothesis' own integers, floats and text)
EDGE = [0, -1, -5, 1, 2, 2.5, math.nan, math.inf, -math.inf, 1e308, -1e308, 2 ** 31, 2 ** 63, 10 ** 30, True, None,
        "x", "", "1e3"]
# required keys and the config group whose keys the index schema needs
FILL = {"encode": {"model_path": "m", "passages": "p", "output_dir": "o"}, "index": {"embeddings": "e", "output": "o"},
        "retrieve": {"output": "o"}, "eval": {"results": ["r"], "output_dir": "o"}, "train": {"output_dir": "o"},
        "prepare": {}, "bm25": {}, "pipeline": {}, "reader": {}}
OVERRIDES = {"bm25": ["data=squad1_open"], "prepare": ["data=squad1_open"], "train": ["data=squad1_open"],
             "index": ["index=ivfpq"]}


def _numeric(tp) -> str | None:
    """'int' / 'float' for int, float, Optional and List of them; None for anything else."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    inner = args[0]
    if typing.get_origin(inner) in (list, typing.List):
        inner = typing.get_args(inner)[0]
    return {int: "int", float: "float"}.get(inner)


def numeric_keys(schema: type, prefix: str = "") -> list[tuple[str, str, bool, bool]]:
    """(dotted key, 'int'|'float', is a list, Optional) for every numeric field, nested groups included."""
    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        tp, key = hints[f.name], prefix + f.name
        if key.startswith(SKIP_GROUPS) or key + "." in SKIP_GROUPS:
            continue
        sub = next((t for t in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(t)), None)
        if sub is not None:
            out += numeric_keys(sub, key + ".")
        elif (kind := _numeric(tp)) is not None:
            is_list = "List" in str(tp) or typing.get_origin(tp) in (list, typing.List)
            out.append((key, kind, is_list, type(None) in typing.get_args(tp)))
    return out


KEYS = [(cmd, *k) for cmd, schema in SCHEMAS.items() for k in numeric_keys(schema)]


@pytest.fixture(scope="module")
def configs() -> dict[str, DictConfig]:
    from dpr.training.config import register_schema

    register_schema()
    out = {}
    for cmd in SCHEMAS:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=cmd, overrides=OVERRIDES.get(cmd, []))
        with open_dict(cfg):
            for key, value in FILL[cmd].items():
                OmegaConf.update(cfg, key, value, merge=False)
        check_config(cfg, SCHEMAS[cmd])  # the shipped defaults are legal
        out[cmd] = cfg
    return out


def test_every_numeric_key_has_a_documented_range():
    from dpr.cli.ranges import range_rules

    assert len(KEYS) > 40
    for cmd, key, *_ in KEYS:
        assert key in range_rules(SCHEMAS[cmd]), f"{cmd}: {key} has no range"


@contextlib.contextmanager
def _set(cfg: DictConfig, key: str, value):
    """``key`` set to ``value`` in ``cfg`` for the block, then put back as the shipped config wrote it (an
    interpolation stays one): cheaper than a copy of the pipeline's whole config per example."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    assert isinstance(parent, DictConfig), f"{key}: no section {parent_key!r} in the shipped config"
    # update changes a leaf in place: its value as shipped kept apart (None: a key the shipped config leaves out)
    node = copy.deepcopy(parent._get_node(leaf)) if leaf in parent else None
    with open_dict(cfg):
        OmegaConf.update(cfg, key, value, merge=False)
    try:
        yield
    finally:
        with open_dict(cfg):
            if node is None:
                del parent[leaf]
            else:
                parent[leaf] = node  # the node itself: its value, type and interpolation


def _legal(kind: str, value, rule, optional: bool) -> bool:
    if value is None:
        return optional
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "int" and not isinstance(value, int)):
        return False
    return math.isfinite(value) and (rule.lo is None or value >= rule.lo) and (rule.hi is None or value <= rule.hi)


def _fusion_runs(key: str, value) -> None:
    """Fuse two tiny result files with the accepted value: every fused score finite, k respected."""
    from dpr.retrieval.runs import hybrid_retrieve

    from tests.system.test_param_checks import BM25, DENSE

    with tempfile.TemporaryDirectory() as d:
        b, dn, out = Path(d) / "b.json", Path(d) / "d.json", Path(d) / "o.json"
        b.write_text(json.dumps(BM25))
        dn.write_text(json.dumps(DENSE))
        kw = {"weight": 0.5}
        if key in ("grid", "metric_k"):
            kw = {"weight": None, "bm25_dev": b, "dense_dev": dn, key: [value] if key == "grid" else value}
        elif key == "k_rrf":
            kw = {"fusion": "rrf", "k_rrf": value}
        elif key in ("weight", "k"):
            kw = {"weight": 0.5, key: value}
        hybrid_retrieve(b, dn, out, **kw)
        fused = json.loads(out.read_text())
        k = value if key == "k" else 100
        assert all(math.isfinite(c["score"]) for r in fused for c in r["ctxs"])
        assert all(0 < len(r["ctxs"]) <= k for r in fused)


def _bm25_runs(key: str, value) -> None:
    from dpr.bm25.index import build_index_from_rows
    from dpr.bm25.search import search_indices

    index = build_index_from_rows([{"id": p, "text": t, "title": ti} for p, t, ti in TINY_PASSAGES],
                                  **({key: value} if key in ("k1", "b") else {}))
    rows, scores = search_indices(index, ["capital of france", "highest mountain"], value if key == "k" else 5,
                                  show_progress=False)
    assert (scores == scores).all() and abs(scores).max() < 1e30 and rows.shape[1] >= 1


# No "${" in the strings: OmegaConf.update would read it as an interpolation and fail in its own parser before
# any schema sees the value (on the command line Hydra's override grammar refuses it first, in one line).
values = st.one_of(st.sampled_from(EDGE), st.integers(-2 ** 70, 2 ** 70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4).filter(lambda t: "${" not in t))


@pytest.mark.parametrize("cmd, key, kind, is_list, optional", KEYS, ids=[f"{c}:{k}" for c, k, *_ in KEYS])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
def test_numeric_key_refused_or_legal(configs, cmd, key, kind, is_list, optional, value):
    from dpr.cli.ranges import range_rules

    cfg = configs[cmd]
    try:
        with _set(cfg, key, [value] if is_list else value):
            merged = check_config(cfg, SCHEMAS[cmd])
    except ValueError as err:
        msg = str(err)
        assert "\n" not in msg and msg.startswith(f"config key {key}"), msg
        return
    got = OmegaConf.select(merged, key)
    got = got[0] if is_list else got
    rule, _ = range_rules(SCHEMAS[cmd])[key]
    assert _legal(kind, got, rule, optional), f"{cmd}: {key}={value!r} accepted as {got!r}, outside {rule.describe()}"
    if got is None:
        return
    if cmd == "retrieve" and key in ("weight", "grid", "k_rrf", "k", "metric_k") and got <= 1000:
        _fusion_runs(key, got)
    elif cmd == "bm25" and key in ("k1", "b", "k") and got <= 1000:
        _bm25_runs(key, got)


def test_reader_settings_are_range_checked_before_any_work(tmp_path):
    """dpr-reader had no schema: a bad reader_cfg value ran (or failed deep inside). Now one line, exit 2."""
    from tests.run_command import run_command

    for args, key in ((["eval", "model=/x", f"output={tmp_path}/o.json", f"results={tmp_path}/r.json",
                        "reader_cfg.eval.n_best=0"], "reader_cfg.eval.n_best"),
                      (["train", f"output_dir={tmp_path}/r", "reader_cfg.train.lr=nan"], "reader_cfg.train.lr")):
        proc = run_command(["dpr-reader", *args], cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.strip().startswith(f"dpr-reader: error: config key {key}:"), \
            proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()
