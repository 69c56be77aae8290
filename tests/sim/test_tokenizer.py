"""The stand-in tokenizer: stateless, invertible, stable under truncation, one token per output word."""

from __future__ import annotations

import pytest

from autotune_sim.tokenizer import Tokenizer

TEXT = "The quick brown fox jumps over 1234567 lazy dogs; naïve café!\nsecond line"


@pytest.fixture
def tok() -> Tokenizer:
    return Tokenizer(128256, add_bos=True)


def test_decode_inverts_encode(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    assert ids[0] == tok.bos
    assert tok.decode(ids) == TEXT
    assert all(0 <= t < tok.vocab_size for t in ids)


def test_about_three_to_four_characters_per_token_on_english(tok: Tokenizer) -> None:
    text = "the model serves many requests with continuous batching and paged attention " * 10
    assert 2.5 < len(text) / len(tok.encode(text, add_special_tokens=False)) < 4.5


def test_truncated_ids_decode_to_text_of_the_same_length(tok: Tokenizer) -> None:
    # What an exact-length prompt builder does: tokenize, cut, detokenize, send the text.
    ids = tok.encode("serving engines " * 50 + "ascii only text", add_special_tokens=False)
    for n in (1, 7, 50, 101):
        assert len(tok.encode(tok.decode(ids[:n]), add_special_tokens=False)) == n


def test_generated_words_are_one_token_each(tok: Tokenizer) -> None:
    for word, token in zip(tok.output_text, tok.output_ids, strict=True):
        assert tok.encode(word, add_special_tokens=False) == [token]
    assert tok.output_token(7, 3) == tok.output_ids[tok.output_index(7, 3)]


def test_every_id_decodes_to_text(tok: Tokenizer) -> None:
    assert tok.decode([40_000, 100_000]) != ""
    with pytest.raises(ValueError, match="out of vocabulary"):
        tok.token_text(128256)


def test_models_without_bos_add_none() -> None:
    assert Tokenizer(151936, add_bos=False).encode("hi") == Tokenizer(151936, add_bos=False).encode("hi", False)


def test_chat_template_wraps_each_message_and_adds_the_generation_prompt(tok: Tokenizer) -> None:
    one = tok.encode_chat([{"role": "user", "content": "hello"}])
    two = tok.encode_chat([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    assert one.count(tok.header_start) == 2 and two.count(tok.header_start) == 3
    assert tok.encode_chat([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]) == one
