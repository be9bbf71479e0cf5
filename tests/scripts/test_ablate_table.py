"""scripts/ablate_training.py's table: percentages for accuracies, nDCG@10 as a fraction, qrels-only variants."""

from __future__ import annotations

from tests.scripts import script


def _module():
    return script("ablate_training")


def test_table_rows_from_train_summaries():
    mod = _module()
    summary = {"steps": 10, "best_step": 5, "wall_time_s": 3.0, "precision": "fp32",
               "final_metrics": {"val_ndcg@10": 0.3167, "val_ndcg@10_ci95": 0.0331, "val_top1": 0.4444},
               "initial_validation": {"ndcg@10": 0.3043, "top1": 0.429}}
    row = mod.row_of("nfcorpus", "frozen_lr5e-5", summary)
    lines = mod.table([row]).splitlines()
    assert lines[0].count("|") == lines[2].count("|") == lines[3].count("|") == 11
    assert "| nfcorpus | (untrained) | 42.9 |" in lines[2] and "| 0.304 |" in lines[2]
    assert "| 44.4 |" in lines[3] and "| 0.317 ± 0.033 | 5 / 10 | 3 |" in lines[3]
    assert set(mod.QRELS_ONLY) <= set(mod.VARIANTS)
