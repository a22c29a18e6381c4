"""Greedy decoding with the decoder's KV cache, stopping at stop strings (harness style).

One prompt at a time: on a CPU a batch of ragged prompts would need padding and position
offsets for no speed-up, and each step after the prompt costs one position thanks to the cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jobs import tokenizer
from jobs.model import Decoder

# What lm-evaluation-harness's gsm8k task stops at (older versions also stop at a blank line).
STOP_STRINGS = ("Question:", "</s>", "<|im_end|>", "\n\n")


@dataclass(frozen=True)
class Generation:
    text: str          # the continuation, cut before the first stop string
    n_tokens: int      # tokens generated (including those of the stop string)
    stopped_by: str    # the stop string, "eos", "max_new_tokens" or "max_seq_len"


def first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string in text, or None."""
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits) if hits else None


@torch.no_grad()
def greedy(model: Decoder, prompt: list[int], max_new_tokens: int,
           stops: tuple[str, ...] = STOP_STRINGS) -> Generation:
    """Continue `prompt` (token ids) greedily until a stop string, EOS or max_new_tokens."""
    device = next(model.parameters()).device
    max_len = model.rope_cos.shape[0]
    cache = model.new_cache()
    logits = model(torch.tensor([prompt], device=device), cache)
    out: list[int] = []
    while True:
        token = int(logits[0, -1].argmax())
        if token == tokenizer.EOS:
            return Generation(tokenizer.decode(out), len(out), "eos")
        out.append(token)
        text = tokenizer.decode(out)
        stop = first_stop(text, stops)
        if stop is not None:
            return Generation(text[:stop[0]], len(out), stop[1])
        if len(out) == max_new_tokens:
            return Generation(text, len(out), "max_new_tokens")
        if cache.length == max_len:
            return Generation(text, len(out), "max_seq_len")
        logits = model(torch.tensor([[token]], device=device), cache)
