"""A question that is not valid text (a lone surrogate, e.g. from a broken JSON escape "\\ud800") is one clear error
naming the question; before, the dense retriever's tokenizer raised a bare TypeError from transformers."""

from __future__ import annotations

import pytest

from dpr.checks import check_questions

from tests.conftest import write_tiny_dataset


def test_a_lone_surrogate_is_refused_naming_the_question():
    bad = "who wrote \ud800hamlet"
    with pytest.raises(ValueError, match=r"questions\[1\] is not valid text: '\\ud800' at position 10 is a lone "
                                         r"surrogate, not a character \(question 'who wrote \\ud800hamlet'\)") as err:
        check_questions(["fine", bad])
    assert "\n" not in str(err.value)
    assert check_questions(["naïve café ☕ 𝔘"]) == ["naïve café ☕ 𝔘"]  # real non-ASCII text is fine


def test_the_retriever_api_refuses_it_before_searching(tmp_path):
    from dpr import Retriever

    root = write_tiny_dataset(tmp_path / "tiny")
    bm25 = Retriever.bm25(root / "passages.tsv")
    with pytest.raises(ValueError, match=r"questions\[0\] is not valid text"):
        bm25.search(["\udfff"], k=2)
    assert bm25.search(["capital of france"], k=1)[0][0].id == "p2"
