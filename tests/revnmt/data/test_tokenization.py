import pytest

from revnmt.data import Detokenizer, Tokenizer

EN = "Mr. Smith's well-known dog, isn't it? (It cost $3.50.)"
DE = "Zwei Männer stehen am Bus-Wartehäuschen, und er zahlt z.B. 3,50 Euro."


@pytest.fixture(scope="module")
def en() -> Tokenizer:
    return Tokenizer("en")


@pytest.fixture(scope="module")
def de() -> Tokenizer:
    return Tokenizer("de")


def test_english_tokens(en):
    assert en.tokenize(EN) == [
        "Mr.", "Smith", "'s", "well", "@-@", "known", "dog", ",", "isn", "'t", "it", "?",
        "(", "It", "cost", "$", "3.50", ".", ")",
    ]  # fmt: skip


def test_german_tokens(de):
    assert de.tokenize(DE) == [
        "Zwei", "Männer", "stehen", "am", "Bus", "@-@", "Wartehäuschen", ",", "und", "er", "zahlt",
        "z.B.", "3,50", "Euro", ".",
    ]  # fmt: skip


def test_no_escaping_of_special_characters(en):
    # -no-escape: "&" and quotes stay as they are, not "&amp;" / "&quot;"
    assert en.tokenize('Tom & "Jerry"') == ["Tom", "&", '"', "Jerry", '"']


def test_lowercase_after_tokenizing():
    tokens = Tokenizer("en", lowercase=True).tokenize("Mr. Smith sees Mr. Jones.")
    # "Mr." stays one token, which it would not if the text were lowercased first.
    assert tokens == ["mr.", "smith", "sees", "mr.", "jones", "."]


def test_blank_line_gives_no_tokens(en):
    assert en.tokenize("   ") == []


@pytest.mark.parametrize(("lang", "sentence"), [("en", EN), ("de", DE)])
def test_detokenize_round_trip(lang, sentence):
    tokens = Tokenizer(lang).tokenize(sentence)
    assert Detokenizer(lang).detokenize(tokens) == sentence


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        (["well", "@-@", "known"], "well-known"),
        (["@-@", "known"], "-known"),
        (["well", "@-@"], "well-"),
        (["a", "@-@", "@-@", "b", "c"], "a--b c"),
        (["@-@"], "-"),
    ],
)
def test_detokenize_removes_every_dash_split_marker(tokens, text):
    assert Detokenizer("en").detokenize(tokens) == text
