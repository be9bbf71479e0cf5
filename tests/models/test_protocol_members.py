"""The `DenseEncoder` protocol declares every member of the bi-encoder that code outside `dpr.models` uses: callers
hold a model through the protocol, so a tower attribute they reach must be part of it, and the real BiEncoder must
have everything the protocol declares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel

from dpr.models import DenseEncoder, is_encoder
from dpr.models.biencoder import BiEncoder, BiEncoderConfig

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "dpr" / "models"


def protocol_members() -> set[str]:
    """What DenseEncoder declares: its annotated attributes, properties and methods."""
    names = set(DenseEncoder.__annotations__)
    names |= {n for n, v in vars(DenseEncoder).items()
              if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def biencoder_members() -> set[str]:
    """BiEncoder's own public members (not nn.Module's): its methods and properties, and the attributes its
    ``__init__`` sets."""
    names = {n for n in vars(BiEncoder) if not n.startswith("_")}
    tree = ast.parse((MODELS / "biencoder.py").read_text())
    init = next(node for cls in tree.body if isinstance(cls, ast.ClassDef) and cls.name == "BiEncoder"
                for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    names |= {t.attr for node in ast.walk(init) if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return {n for n in names if not n.startswith("_") and not hasattr(nn.Module, n)}


def uses_outside_models() -> dict[str, list[str]]:
    """Every ``<expr>.<name>`` in dpr/ (outside dpr/models) and scripts/ whose name is a BiEncoder member:
    ``{name: ["file:line", ...]}``. A name shared with other objects (``config``, ``device``) counts too, so the
    check errs towards declaring more."""
    members = biencoder_members()
    found: dict[str, list[str]] = {}
    files = [p for p in sorted((ROOT / "dpr").rglob("*.py")) if MODELS not in p.parents]
    files += sorted((ROOT / "scripts").rglob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in members:
                found.setdefault(node.attr, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_member_used_outside_dpr_models_is_declared():
    declared = protocol_members()
    missing = {name: where[:3] for name, where in uses_outside_models().items() if name not in declared}
    assert missing == {}, f"declare these on dpr.models.protocol.DenseEncoder (or keep them in dpr/models): {missing}"


def test_the_tower_attributes_callers_use_are_declared():
    # found by reading the callers (dpr/training, dpr/encode.py, dpr/retrieval, dpr/export): the scan above must
    # see them, and the protocol must declare them
    used = {"question_encoder", "passage_encoder", "question_projection", "passage_projection", "hidden_size"}
    assert used <= set(uses_outside_models())
    assert used <= protocol_members()


@pytest.mark.parametrize("shared", [False, True], ids=["separate", "shared"])
def test_a_real_biencoder_has_every_declared_member(shared):
    torch.manual_seed(0)
    bert = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32)
    question = BertModel(bert)
    model = BiEncoder(BiEncoderConfig(name="tiny", shared=shared, projection_dim=8), question,
                      None if shared else BertModel(bert))
    assert is_encoder(model) and isinstance(model, DenseEncoder)
    assert [n for n in sorted(protocol_members()) if not hasattr(model, n)] == []
    assert model.hidden_size == 16 and model.dim == 8
    assert isinstance(model.passage_encoder, nn.Module) and isinstance(model.passage_projection, nn.Linear)
    assert (model.passage_encoder is question) == shared


def test_a_module_without_the_towers_is_no_dense_encoder():
    class Partial(nn.Module):
        config = None
        dim = 4
        device = torch.device("cpu")

        def pool(self, hidden, attention_mask): ...
        def encode_questions(self, input_ids, attention_mask, token_type_ids=None): ...
        def encode_passages(self, input_ids, attention_mask, token_type_ids=None): ...
        def similarity(self, q, p): ...

    assert not is_encoder(Partial())
