"""A deterministic stand-in tokenizer: stateless, invertible, about 3.5 characters per token.

Text is cut into pieces and each piece is one id:

* a run of lowercase letters, with its leading space if any, in chunks of up to 3 letters
  (``" hello"`` → ``" hel"``, ``"lo"``);
* a run of digits in groups of up to 3;
* any other character as its UTF-8 bytes, one id per byte (byte fallback).

Ids are arithmetic, so any process decodes any id without a vocabulary file, and cutting a
token list and decoding it re-encodes to the same count (what exact-length prompt builders
rely on). Special tokens sit at the top of the model's vocabulary; ids between the last piece
id and the specials decode to a piece chosen by their value, so every id has text.

Generated tokens come from a fixed list of short English words, each exactly one token.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Tokenizer"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Id ranges: (first id, piece length in letters/digits, leading space, alphabet)
_BYTE_END = 256
_RANGES: list[tuple[int, int, bool, str]] = []
_start = _BYTE_END
for _space in (True, False):
    for _n in (1, 2, 3):
        _RANGES.append((_start, _n, _space, _LETTERS))
        _start += 26**_n
for _n in (1, 2, 3):
    _RANGES.append((_start, _n, False, "0123456789"))
    _start += 10**_n
_PIECE_END = _start  # 37922: first id past the arithmetic pieces
_SPECIALS = ("<|bos|>", "<|eos|>", "<|start_header|>", "<|end_header|>", "<|eot|>")

_SPLIT = re.compile(r"( ?[a-z]+)|([0-9]+)|(.)", re.DOTALL)

# One-token words for generated text (a space and 1–3 lowercase letters each).
_WORDS = """the of and to in is it you he was for on are as his at be or one had by but not all we can use an she do
how if up out so her him see two way who its now may day did get has new any our own say too old why let put end men
set try ask big far run"""
_OUTPUT_WORDS = tuple(" " + word for word in _WORDS.split())


def _range_of(length: int, space: bool, alphabet: str) -> int:
    for first, n, sp, alpha in _RANGES:
        if n == length and sp == space and alpha == alphabet:
            return first
    raise AssertionError("unreachable")


def _piece_id(piece: str, alphabet: str) -> int:
    space = piece[0] == " "
    body = piece[1:] if space else piece
    value = 0
    base = len(alphabet)
    for ch in body:
        value = value * base + alphabet.index(ch)
    return _range_of(len(body), space, alphabet) + value


def _piece_text(token: int) -> str:
    for first, n, space, alphabet in reversed(_RANGES):
        if token >= first:
            value, base = token - first, len(alphabet)
            chars = []
            for _ in range(n):
                value, digit = divmod(value, base)
                chars.append(alphabet[digit])
            return (" " if space else "") + "".join(reversed(chars))
    raise AssertionError("unreachable")


class Tokenizer:
    """Encode/decode for one model's vocabulary size.

    Args:
        vocab_size: The model's vocabulary; specials take its top ids.
        add_bos: Whether encoding with special tokens prepends BOS (Llama does, Qwen does not).
    """

    def __init__(self, vocab_size: int, add_bos: bool) -> None:
        if vocab_size < _PIECE_END + len(_SPECIALS):
            raise ValueError(f"vocabulary of {vocab_size} is too small for the simulated tokenizer")
        self.vocab_size = vocab_size
        self.add_bos = add_bos
        top = vocab_size - 1
        self.bos, self.eos, self.header_start, self.header_end, self.eot = (top - i for i in range(5))
        self._special_text = {top - i: text for i, text in enumerate(_SPECIALS)}
        self.output_ids = [self.encode(w, add_special_tokens=False)[0] for w in _OUTPUT_WORDS]
        # JSON-escaped bytes of each output word (without quotes), for the streaming hot path.
        self.output_json = [json.dumps(w)[1:-1].encode() for w in _OUTPUT_WORDS]
        self.output_text = list(_OUTPUT_WORDS)

    # ------------------------------------------------------------------------------ encode
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS first when the model has one and specials are wanted)."""
        ids: list[int] = [self.bos] if add_special_tokens and self.add_bos else []
        for m in _SPLIT.finditer(text):
            word, digits, other = m.group(1), m.group(2), m.group(3)
            if word is not None:
                head = 4 if word[0] == " " else 3
                ids.append(_piece_id(word[:head], _LETTERS))
                for i in range(head, len(word), 3):
                    ids.append(_piece_id(word[i : i + 3], _LETTERS))
            elif digits is not None:
                for i in range(0, len(digits), 3):
                    ids.append(_piece_id(digits[i : i + 3], "0123456789"))
            else:
                ids.extend(other.encode())
        return ids

    def encode_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Ids of a conversation under a Llama-3-style template (header, body, end of turn)."""
        ids: list[int] = [self.bos] if self.add_bos else []
        for message in messages:
            ids += self._header(str(message.get("role", "user")))
            ids += self.encode(_content_text(message.get("content")), add_special_tokens=False)
            ids.append(self.eot)
        if add_generation_prompt:
            ids += self._header("assistant")
        return ids

    def _header(self, role: str) -> list[int]:
        return [self.header_start, *self.encode(role, add_special_tokens=False), self.header_end, 10, 10]

    # ------------------------------------------------------------------------------ decode
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; byte tokens are joined and decoded as UTF-8 (bad bytes → U+FFFD)."""
        out: list[str] = []
        pending = bytearray()
        for token in ids:
            if 0 <= token < _BYTE_END:
                pending.append(token)
                continue
            if pending:
                out.append(pending.decode(errors="replace"))
                pending.clear()
            out.append(self.token_text(token, skip_special_tokens))
        if pending:
            out.append(pending.decode(errors="replace"))
        return "".join(out)

    def token_text(self, token: int, skip_special_tokens: bool = True) -> str:
        """Text of one non-byte id."""
        if token in self._special_text:
            return "" if skip_special_tokens else self._special_text[token]
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"token id {token} is out of vocabulary")
        if token >= _PIECE_END:  # unassigned ids fold onto the piece ranges
            token = _BYTE_END + (token - _PIECE_END) % (_PIECE_END - _BYTE_END)
        return _piece_text(token)

    def token_strs(self, ids: Iterable[int]) -> list[str]:
        """One display string per id (byte ids as ``<0xNN>``)."""
        return [f"<0x{t:02X}>" if 0 <= t < _BYTE_END else self.token_text(t, False) for t in ids]

    def valid(self, ids: Sequence[int]) -> bool:
        """Whether every id is inside the vocabulary."""
        return all(0 <= t < self.vocab_size for t in ids)

    # ------------------------------------------------------------------------------ output
    def output_index(self, seed: int, position: int) -> int:
        """Which output word the ``position``-th generated token of a request is."""
        return (seed + position * 7919) % len(self.output_ids)

    def output_token(self, seed: int, position: int) -> int:
        """Id of the ``position``-th generated token of a request with this seed."""
        return self.output_ids[self.output_index(seed, position)]


def _content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)
