"""Datasets: readers and writers for the on-disk formats, validation, the source registry and the
preparation recipes.

- `dpr.data.passages` — passages TSV (``id<TAB>text<TAB>title``): streaming, Arrow-backed loading.
- `dpr.data.qa` — QA TSV (``question<TAB>["answer", ...]``).
- `dpr.data.retriever_json` — DPR retriever training JSON.
- `dpr.data.beir` — BEIR corpus/queries JSONL and qrels TSV.
- `dpr.data.results` — DPR results JSON and TREC run files.
- `dpr.data.squad`, `dpr.data.sciq`, `dpr.data.nq_open` — raw source formats.
- `dpr.data.dataset` — `DatasetPaths`, the layout of a prepared dataset.
- `dpr.data.sources` — the registry (``data/registry.yaml``) and checksum-verified fetching.
- `dpr.data.prepare` — `prepare_dataset` and one recipe module per dataset.

Submodules are imported on demand (``datasets`` in particular is slow to import).
"""
