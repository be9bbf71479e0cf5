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


def _bpe_tokenizer(post_processor: str):
    """A tiny byte-level BPE tokenizer shaped like Qwen2's (a ByteLevel post-processor) or Llama's (a BOS template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["who wrote hamlet", "Paris is the capital of France.", "a b c d e f g x"] * 5,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"]))
    if post_processor == "bytelevel":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.mark.parametrize("post_processor", ["bytelevel", "bos-template"])
def test_eos_template_on_llm_shaped_tokenizers_survives_saving(tmp_path, post_processor):
    """Qwen2-like (ByteLevel) and Llama-like (BOS template) tokenizers: EOS appended once, after the template's own
    tokens, truncation keeping it; the saved copy loads with the template (what sentence-transformers reads)."""
    from transformers import AutoTokenizer

    from dpr.export.eos_template import with_eos_template
    from dpr.models.eos_tokenizer import EosTokenizer

    tok = _bpe_tokenizer(post_processor)
    copy = with_eos_template(tok, [6, 32], "tower")
    copy.save_pretrained(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    for text, pair in (("who wrote hamlet", None), ("Paris is the capital of France. " * 3, None), ("Hamlet", "x y")):
        for length in (6, 32):
            ids = loaded(text, pair, truncation=True, max_length=length)["input_ids"]
            assert ids == EosTokenizer(tok)(text, pair, truncation=True, max_length=length)["input_ids"]
            assert ids[-1] == tok.eos_token_id and ids.count(tok.eos_token_id) == 1 and len(ids) <= length
            assert (ids[0] == tok.bos_token_id) is (post_processor == "bos-template")
