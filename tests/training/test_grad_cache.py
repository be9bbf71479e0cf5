"""The gradient cache gives the gradients of the uncached step, dropout included."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dpr.losses import HingeLoss, KLDistillLoss, MarginMSELoss, PairMasks, SoftmaxNLLLoss
from dpr.models import BiEncoderConfig, build_biencoder
from dpr.models.length_buckets import length_order, restore_order
from dpr.training import grad_cache
from dpr.training.grad_cache import grad_cache_step, split_inputs
from dpr.training.steps import make_step, standard_step

from tests.system.ddp_worker import PASSAGES, QUESTIONS  # the 2-process test's batch: pos_i, hn_i per question

NAN = float("nan")
TEACHER = [[5.0, 1.0, 2.0, 0.5, NAN, 3.0, NAN, 0.0],  # a teacher's scores of the pairs (NaN: not scored)
           [NAN, 2.0, 6.0, 1.0, 0.5, NAN, 4.0, NAN],
           [1.0, NAN, 0.0, 2.5, 7.0, 1.5, NAN, 3.0],
           [3.5, 0.0, NAN, 1.0, 2.0, NAN, 8.0, 1.0]]


def setup(tiny_model_dir, loss=None, **kw):
    torch.manual_seed(0)
    loss = loss or SoftmaxNLLLoss()
    masks = PairMasks.dpr_layout(len(QUESTIONS), 2)
    masks.ignore[0, 3] = True  # one masked pair: the masks must reach the loss in both steps
    masks.teacher = torch.tensor(TEACHER)  # for the distillation losses
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), projection_dim=8, **kw))
    q = dict(tok(QUESTIONS, padding="longest", return_tensors="pt"))
    p = dict(tok(PASSAGES, padding="longest", return_tensors="pt"))

    def loss_fn(qv, pv):
        return loss(qv, pv, masks, model.similarity)

    return model, q, p, loss_fn


def grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(a, b, atol=1e-5):
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol, rtol=1e-5), (name, (a[name] - b[name]).abs().max())


@pytest.mark.parametrize("loss", [SoftmaxNLLLoss(), HingeLoss(0.5), KLDistillLoss(nll_weight=0.5, teacher_temperature=2.0),
                                  MarginMSELoss(teacher_scale=0.5)],
                         ids=["softmax_nll", "hinge", "kl_distill", "margin_mse"])
@pytest.mark.parametrize("chunk_size", [1, 3])
def test_same_gradients_as_standard_step_without_dropout(tiny_model_dir, chunk_size, loss):
    model, q, p, loss_fn = setup(tiny_model_dir, loss)
    model.eval()
    ref = standard_step(model, q, p, loss_fn)
    ref_grads = grads(model)
    out = grad_cache_step(model, q, p, loss_fn, chunk_size=chunk_size)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    assert out.accuracy == ref.accuracy and out.avg_rank == ref.avg_rank
    assert not out.loss.requires_grad
    assert_same_grads(grads(model), ref_grads)


def test_one_chunk_with_dropout_equals_standard_step(tiny_model_dir):
    """A chunk as large as the batch consumes the RNG exactly like the uncached step."""
    model, q, p, loss_fn = setup(tiny_model_dir)
    model.train()
    torch.manual_seed(123)
    ref = standard_step(model, q, p, loss_fn)
    ref_grads = grads(model)
    torch.manual_seed(123)
    out = grad_cache_step(model, q, p, loss_fn, chunk_size=16)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    assert_same_grads(grads(model), ref_grads)


def chunked_reference(model, q, p, loss_fn, chunk_size):
    """Forward with graphs in the gradient cache's chunk order (rows longest first, same dropout draws),
    the loss on the batch's order, one backward."""
    q_order, p_order = length_order(q["attention_mask"]), length_order(p["attention_mask"])
    qc = split_inputs({k: v[q_order] for k, v in q.items()}, chunk_size)
    pc = split_inputs({k: v[p_order] for k, v in p.items()}, chunk_size)
    qs, ps = [], []
    for c in qc[:-1]:
        qs.append(model(c, None)[0])
    for c in pc[:-1]:
        ps.append(model(None, c)[1])
    ql, pl = model(qc[-1], pc[-1])
    out = loss_fn(restore_order(torch.cat(qs + [ql]), q_order), restore_order(torch.cat(ps + [pl]), p_order))
    out.loss.backward()
    return out


def test_small_chunks_with_dropout_replay_the_same_masks(tiny_model_dir):
    model, q, p, loss_fn = setup(tiny_model_dir)
    model.train()
    torch.manual_seed(7)
    ref = chunked_reference(model, q, p, loss_fn, 2)
    ref_grads = grads(model)
    rng_after_ref = torch.get_rng_state()
    torch.manual_seed(7)
    out = grad_cache_step(model, q, p, loss_fn, chunk_size=2)
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=1e-6)
    assert_same_grads(grads(model), ref_grads)
    # The global RNG continues from where the first pass left it: runs stay reproducible.
    assert torch.equal(torch.get_rng_state(), rng_after_ref)


def test_without_rng_replay_the_gradients_differ(tiny_model_dir, monkeypatch):
    """Negative control: the test above would catch a gradient cache that forgot the RNG states."""
    model, q, p, loss_fn = setup(tiny_model_dir)
    model.train()
    torch.manual_seed(7)
    chunked_reference(model, q, p, loss_fn, 2)
    ref_grads = grads(model)
    monkeypatch.setattr(grad_cache._RngState, "restored", lambda self: contextlib.nullcontext())
    torch.manual_seed(7)
    grad_cache_step(model, q, p, loss_fn, chunk_size=2)
    got = grads(model)
    assert any(not torch.allclose(got[n], ref_grads[n], atol=1e-5) for n in ref_grads)


def test_autocast_context_is_used(tiny_model_dir):
    model, q, p, loss_fn = setup(tiny_model_dir)
    model.eval()
    ref = standard_step(model, q, p, loss_fn)
    grads(model)
    out = grad_cache_step(model, q, p, loss_fn, 2, autocast_ctx=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert out.loss.item() != ref.loss.item()  # bf16 really ran
    assert out.loss.item() == pytest.approx(ref.loss.item(), abs=0.05)
    assert all(torch.isfinite(g).all() for g in grads(model).values())


def test_split_inputs_trims_padding_per_chunk():
    ids = torch.tensor([[1, 2, 3, 0], [1, 2, 0, 0], [1, 0, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids > 0).long(), "token_type_ids": torch.zeros_like(ids)}
    chunks = split_inputs(batch, 2)
    assert [c["input_ids"].shape for c in chunks] == [(2, 3), (1, 1)]
    assert chunks[1]["attention_mask"].tolist() == [[1]]
    with pytest.raises(ValueError):
        grad_cache_step(torch.nn.Identity(), batch, batch, lambda q, p: None, chunk_size=0)


def test_make_step_picks_the_step(tiny_model_dir):
    assert make_step(None) is standard_step and make_step(0) is standard_step
    model, q, p, loss_fn = setup(tiny_model_dir)
    model.eval()
    a = make_step(2)(model, q, p, loss_fn)
    grads(model)
    b = standard_step(model, q, p, loss_fn)
    assert a.loss.item() == pytest.approx(b.loss.item(), abs=1e-6)
