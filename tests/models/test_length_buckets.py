"""Length-sorted buckets give the single padded forward's vectors and gradients, for fewer tokens."""

from __future__ import annotations

import pytest
import torch

from dpr.losses import PairMasks, SoftmaxNLLLoss
from dpr.models import BiEncoderConfig, build_biencoder
from dpr.models.length_buckets import encode_bucketed, length_order, trim_padding
from dpr.training.config import TrainConfig
from dpr.training.steps import make_step, standard_step

QUESTIONS = ["capital of hawaii", "what makes atp in cells and why does it matter so much", "highest mountain",
             "largest ocean on the planet earth", "who wrote hamlet", "boiling point of water at sea level",
             "speed of light", "tallest building in the world as of today", "a", "how many legs does a spider have"]
PASSAGES = [f"passage {i} " + " ".join(["word"] * (3 * i % 17)) + f" about {q}" for i, q in enumerate(QUESTIONS * 2)]


def tiny(tiny_model_dir):
    torch.manual_seed(0)
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), projection_dim=8))
    q = dict(tok(QUESTIONS, padding="longest", return_tensors="pt"))
    p = dict(tok(PASSAGES, padding="longest", return_tensors="pt"))
    return model, q, p


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: w.grad.clone() for n, w in model.named_parameters() if w.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("bucket_size", [1, 3, 8])
def test_same_vectors_as_one_padded_forward(tiny_model_dir, bucket_size):
    model, q, p = tiny(tiny_model_dir)
    model.eval()
    with torch.no_grad():
        ref_q, ref_p = model(q, p)
        got_q, got_p = model(q, p, bucket_size=bucket_size)
    assert torch.allclose(got_q, ref_q, atol=1e-6) and torch.allclose(got_p, ref_p, atol=1e-6)


@pytest.mark.parametrize("bucket_size", [2, 8])
def test_same_loss_and_gradients_as_one_padded_forward(tiny_model_dir, bucket_size):
    model, q, p = tiny(tiny_model_dir)
    model.eval()  # no dropout: the only difference left is rounding
    masks = PairMasks.dpr_layout(len(QUESTIONS), 2)
    masks.ignore[0, 3] = True

    def loss_fn(qv, pv):
        return SoftmaxNLLLoss()(qv, pv, masks, model.similarity)

    ref = standard_step(model, q, p, loss_fn)
    ref_grads = grads(model)
    out = make_step(0, bucket_size)(model, q, p, loss_fn)
    got = grads(model)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    assert got.keys() == ref_grads.keys() and len(got) > 10
    for name in got:
        assert torch.allclose(got[name], ref_grads[name], atol=1e-5, rtol=1e-4), name


def test_each_bucket_is_length_sorted_and_padded_only_to_its_longest():
    ids = torch.tensor([[1, 2, 0, 0, 0], [1, 2, 3, 4, 5], [1, 0, 0, 0, 0], [1, 2, 3, 0, 0], [1, 2, 3, 4, 0]])
    inputs = {"input_ids": ids, "attention_mask": (ids > 0).long()}
    seen = []

    def encode(input_ids, attention_mask):
        seen.append((input_ids[:, 0].tolist(), tuple(input_ids.shape)))
        return attention_mask.sum(dim=1, keepdim=True).float()  # each row's length, so order is checkable

    out = encode_bucketed(encode, inputs, 2)
    assert out.squeeze(1).tolist() == [2, 5, 1, 3, 4]  # back in input order
    assert [shape for _, shape in seen] == [(2, 5), (2, 3), (1, 1)]  # 5,4 | 3,2 | 1: each cut to its longest


def test_no_buckets_when_off_or_the_batch_fits_one():
    inputs = {"input_ids": torch.ones(4, 3, dtype=torch.long), "attention_mask": torch.ones(4, 3, dtype=torch.long)}
    calls = []

    def encode(input_ids, attention_mask=None):
        calls.append(input_ids.shape[0])
        return input_ids.float()

    encode_bucketed(encode, inputs, 0)
    encode_bucketed(encode, inputs, 4)
    encode_bucketed(encode, {"input_ids": inputs["input_ids"]}, 2)  # no mask: nothing to sort by
    assert calls == [4, 4, 4]


def test_length_order_is_stable_and_trim_keeps_left_padding_rows():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    assert length_order(mask).tolist() == [1, 0, 2, 3]
    left = {"input_ids": torch.tensor([[0, 0, 7], [0, 5, 6]]), "attention_mask": torch.tensor([[0, 0, 1], [0, 1, 1]])}
    trimmed = trim_padding(left)
    assert trimmed["input_ids"].tolist() == [[0, 7], [5, 6]]
    assert trimmed["attention_mask"].tolist() == [[0, 1], [1, 1]]


def test_negative_bucket_size_is_refused():
    with pytest.raises(ValueError, match="length_bucket_size"):
        TrainConfig.from_dict({"length_bucket_size": -1})


def test_gradient_cache_chunks_rows_longest_first(tiny_model_dir):
    """Its chunks pad to lengths close to their own, and the loss still sees the batch's order."""
    model, q, p = tiny(tiny_model_dir)
    model.eval()
    masks = PairMasks.dpr_layout(len(QUESTIONS), 2)
    widths, lengths = [], []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, q_in, p_in):
            if p_in is not None:
                widths.append(p_in["input_ids"].shape[1])
                lengths.extend(p_in["attention_mask"].sum(1).tolist())
            return self.inner(q_in, p_in)

    def loss_fn(qv, pv):
        return SoftmaxNLLLoss()(qv, pv, masks, model.similarity)

    ref = standard_step(model, q, p, loss_fn)
    ref_grads = grads(model)
    out = make_step(4)(Recorder(), q, p, loss_fn)
    passes = len(lengths) // 2  # pass 1 and pass 2 see the same chunks
    assert lengths[:passes] == sorted(p["attention_mask"].sum(1).tolist(), reverse=True)
    assert widths[0] == p["input_ids"].shape[1] and widths[-1] < widths[0]  # the short rows' chunk is narrower
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    got = grads(model)
    for name in got:
        assert torch.allclose(got[name], ref_grads[name], atol=1e-5, rtol=1e-4), name
