"""DPR's has_answer: tokenization-based string matching and CuratedTREC regex matching."""

from __future__ import annotations

import unicodedata

import pytest

from dpr.eval.has_answer import has_answer, tokenize


@pytest.mark.parametrize(
    "answers, text, expected",
    [
        # whole tokens in sequence, not substrings
        (["in Honolulu"], "He was born at Honolulu.", False),
        (["in Honolulu"], "He was born in Honolulu.", True),
        (["Honolulu"], "HONOLULU!", True),
        (["Hono"], "Honolulu is a city", False),
        (["lulu"], "Honolulu is a city", False),
        (["honolulu hawaii"], "Honolulu, Hawaii", False),  # the comma is a token between them
        (["Honolulu, Hawaii"], "in honolulu ,hawaii", True),  # spacing around symbols does not matter
        # punctuation is tokenized into single symbols
        (["U.S."], "the U.S. army", True),
        (["U.S."], "the US army", False),
        (["1,000"], "about 1,000 men", True),
        (["1000"], "about 1,000 men", False),
        (["1,000"], "about 1000 men", False),
        (["$5"], "it cost $5 then", True),
        # accents are kept (NFD keeps the combining mark inside the token); case is not
        (["Saint-Étienne"], "saint etienne", False),
        (["Saint-Étienne"], "SAINT-ÉTIENNE won", True),
        (["Saint Étienne"], "Saint-Étienne", False),
        (["Beyoncé"], "beyonce", False),
        # any of several answers
        (["Pacific Ocean", "Pacific"], "the pacific is large", True),
        (["Atlantic", "Indian Ocean"], "the pacific is large", False),
        # an answer that tokenizes to nothing matches nothing (DPR would report it everywhere)
        ([""], "anything", False),
        (["   "], "anything", False),
        ([], "anything", False),
    ],
)
def test_string_mode(answers, text, expected):
    assert has_answer(answers, text) is expected


def test_composed_and_decomposed_forms_are_equal():
    composed = unicodedata.normalize("NFC", "Beyoncé Knowles")
    decomposed = unicodedata.normalize("NFD", "Beyoncé Knowles")
    assert composed != decomposed
    assert has_answer(["beyoncé"], decomposed)
    assert has_answer([decomposed.split()[0]], composed)


def test_tokenizer_matches_dpr_simple_tokenizer():
    # alphanumeric runs (letters, digits, marks) and single non-space symbols, lower-cased
    assert tokenize("Hello, World! 3.14") == ["hello", ",", "world", "!", "3", ".", "14"]
    assert tokenize("Saint-Étienne") == ["saint", "-", unicodedata.normalize("NFD", "étienne")]
    assert tokenize("e-mail\u00a0x") == ["e", "-", "mail", "x"]  # no-break space separates
    assert tokenize("  ") == []


@pytest.mark.parametrize(
    "patterns, text, expected",
    [
        ([r"Bill\s+Clinton"], "President bill   clinton said", True),
        ([r"19[0-9]{2}"], "in 1987", True),
        ([r"^Paris$"], "London\nParis\nRome", True),  # MULTILINE, as DPR
        ([r"Clinton"], "Hillary", False),
        ([r"(unclosed", r"Hillary"], "Hillary", True),  # a bad pattern is just not found
        ([r"(unclosed"], "(unclosed", False),
        ([r"étienne"], "SAINT-ÉTIENNE", True),
    ],
)
def test_regex_mode(patterns, text, expected):
    assert has_answer(patterns, text, mode="regex") is expected


def test_unknown_mode_rejected():
    with pytest.raises(ValueError, match="unknown match mode"):
        has_answer(["x"], "x", mode="fuzzy")
