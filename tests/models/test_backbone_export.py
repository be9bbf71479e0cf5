"""The sentence-transformers export of a decoder (last-token and EOS pooling) and of a LoRA model gives our vectors."""

from __future__ import annotations

import pytest
import torch

from dpr.models import BiEncoderConfig, build_biencoder, encode_texts, load_biencoder, save_biencoder

pytestmark = pytest.mark.usefixtures("one_thread")
QUESTIONS = ["who wrote hamlet", "what is the capital of france and which river crosses it", "boiling point"]
PASSAGES = ["Hamlet is a tragedy by William Shakespeare.", "Paris is the capital of France.", "Water boils."]


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}],
                         ids=["last-token", "lora"])
@pytest.mark.parametrize("shared", [True, False])
def test_sentence_transformers_export_gives_our_vectors(tiny_qwen2_dir, tmp_path, lora, shared):
    from sentence_transformers import SentenceTransformer

    from dpr.export import export_sentence_transformers

    torch.manual_seed(0)
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_qwen2_dir), pooling="last", shared=shared, lora=lora,
                                                 similarity="cosine", question_prefix="Instruct: find\nQuery: "))
    with torch.no_grad():  # adapters (or the towers) away from their start, so the export must carry them
        for name, p in model.named_parameters():
            if lora is None or "lora_" in name:
                p.add_(torch.randn_like(p) * 0.02)
    save_biencoder(model, tok, tmp_path / "run")
    run, rtok = load_biencoder(tmp_path / "run")
    export_sentence_transformers(tmp_path / "run", tmp_path / "st")
    card = (tmp_path / "st" / "README.md").read_text()
    assert ("merged into the base model" in card) is (lora is not None)
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu", local_files_only=True)
    ours_q = encode_texts(run, rtok, QUESTIONS, "question", autocast="off")
    ours_p = encode_texts(run, rtok, PASSAGES, "passage", autocast="off")
    theirs_q = torch.as_tensor(st.encode_query(QUESTIONS, batch_size=8))
    theirs_p = torch.as_tensor(st.encode_document(PASSAGES, batch_size=8))
    assert (ours_q - theirs_q).abs().max() <= 1e-4 and (ours_p - theirs_p).abs().max() <= 1e-4


@pytest.mark.parametrize("shared", [True, False])
def test_eos_pooling_export_gives_our_vectors(tiny_llama_dir, tmp_path, shared):
    """pooling=eos: the copy's tokenizer appends EOS through its own template (saved as a plain fast tokenizer, so
    that loading keeps it): sentence-transformers' vectors are ours, questions and (title, text) passages alike."""
    from sentence_transformers import SentenceTransformer

    from dpr.export import export_sentence_transformers

    torch.manual_seed(0)
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_llama_dir), pooling="eos", shared=shared,
                                                 similarity="cosine", question_max_length=12,
                                                 passage_max_length=16))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    save_biencoder(model, tok, tmp_path / "run")
    run, rtok = load_biencoder(tmp_path / "run")
    export_sentence_transformers(tmp_path / "run", tmp_path / "st")
    st = SentenceTransformer(str(tmp_path / "st"), device="cpu", local_files_only=True)
    titles = ["Hamlet", "Paris", "Water"]
    ours_q = encode_texts(run, rtok, QUESTIONS, "question", autocast="off")  # one question longer than 12 tokens
    ours_p = encode_texts(run, rtok, PASSAGES, "passage", titles=titles, autocast="off")
    theirs_q = torch.as_tensor(st.encode_query(QUESTIONS, batch_size=8))
    theirs_p = torch.as_tensor(st.encode_document(list(zip(titles, PASSAGES)), batch_size=8))
    assert (ours_q - theirs_q).abs().max() <= 1e-4 and (ours_p - theirs_p).abs().max() <= 1e-4


def test_eos_template_refuses_a_post_processor_it_cannot_extend(tiny_llama_dir):
    from tokenizers.processors import BertProcessing
    from transformers import AutoTokenizer

    from dpr.export.eos_template import with_eos_template

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert with_eos_template(tok, [8], "tower")("hi there")["input_ids"][-1] == tok.eos_token_id
    tok.backend_tokenizer.post_processor = BertProcessing(("[SEP]", 102), ("[CLS]", 101))
    with pytest.raises(ValueError, match=r"^tower: pooling=eos .*BertProcessing"):
        with_eos_template(tok, [8], "tower")
