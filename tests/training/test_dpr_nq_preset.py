"""``train=dpr_nq``: DPR's NQ recipe (facebookresearch/DPR conf/train/biencoder_nq.yaml) composes and validates."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dpr.cli.common import CONF_DIR
from dpr.training.config import TrainConfig, register_schema


def test_the_preset_is_dprs_nq_recipe_and_validates():
    import dpr.cli.train  # noqa: F401  registers the groups conf/train.yaml composes (bm25_cfg)

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=["train=dpr_nq"])
    train = OmegaConf.to_container(cfg.train, resolve=True)
    tc = TrainConfig.from_dict(train)
    # 16 a GPU x 8 GPUs = DPR's 128; lr 2e-5, 1,237 warm-up steps, 40 epochs, one BM25 negative, no other negatives
    assert (tc.batch_size, tc.lr, tc.warmup_steps, tc.epochs, tc.max_steps) == (16, 2e-5, 1237, 40, 0)
    assert (tc.hard_negatives, tc.other_negatives, tc.max_grad_norm, tc.weight_decay) == (1, False, 2.0, 0.0)
    assert (tc.shuffle_positives, tc.val_hard_negatives, tc.frozen_steps) == (False, 30, 0)
