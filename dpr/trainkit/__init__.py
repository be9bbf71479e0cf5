"""The training kit every trainer shares: the retriever's (`dpr.training`), the reader's (`dpr.reader.train`) and
the cross-encoder's (`dpr.rerank.train`).

- `precision` — the one rule turning ``auto`` | ``fp32`` | ``bf16`` | ``fp16`` into a dtype and an autocast
  context on a device (training, validation, encoding, scoring and reading all ask it).
- `seed` — seeding, deterministic algorithms, the RNG states a checkpoint carries.
- `config_dict` — `plain(cfg)`: a Hydra/OmegaConf node, a dataclass or a mapping as a plain dict.
- `checkpoint` — resumable checkpoints and best weights on disk, run fingerprints, resuming.
- `optim` — AdamW, warm-up/decay schedules, clipping, the update after a backward pass.
- `metrics_log` — ``metrics.jsonl`` / ``validation.jsonl`` and wandb.

Nothing here knows a model or a dataset: it imports only torch, omegaconf and the floors below it
(`dpr.perf`, `dpr.atomic`, `dpr.errors`, `dpr.config`, `dpr.distributed`). The package imports nothing itself, so
`from dpr.trainkit.config_dict import plain` does not load torch.
"""
