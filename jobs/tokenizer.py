"""Byte-level tokenizer: token id = byte value (0-255) plus three specials.

No vocabulary to train or download, and every string round-trips exactly, which is what a
CPU text model needs. On real text it costs about four times the tokens of a BPE tokenizer
(a GSM8K 8-shot prompt is ~4,000 bytes), so context lengths must be sized in bytes.
"""
from __future__ import annotations

from config.data import BYTE_VOCAB_SIZE as VOCAB_SIZE  # noqa: F401  (data.vocab_size is checked against it)

BOS, EOS, PAD = 256, 257, 258


def encode(text: str, bos: bool = False, eos: bool = False) -> list[int]:
    """UTF-8 bytes of `text`, optionally wrapped in BOS / EOS."""
    return [BOS] * bos + list(text.encode("utf-8")) + [EOS] * eos


def decode(ids: list[int]) -> str:
    """Inverse of `encode`: specials are dropped, and a multi-byte character cut in half (as in a
    partly generated sequence) becomes U+FFFD instead of an error."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
