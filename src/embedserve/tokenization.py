"""Text to token ids with the model's own `tokenizer.json`, and the truncation policy.

Pure CPU work with no torch import: the gateway and the offline `Embedder` share it.
Inputs longer than the model's limit are an error unless the caller asks for truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer

from embedserve.spec import ModelLoadError

Truncate = Literal[False, "end", "start"]
TRUNCATE_CHOICES: tuple[object, ...] = (False, "end", "start")


class InputTooLong(ValueError):
    """An input over the model's token limit, with no truncation asked for."""

    def __init__(self, index: int, num_tokens: int, max_length: int) -> None:
        super().__init__(
            f"input {index} has {num_tokens} tokens, over this model's limit of {max_length}; "
            "shorten it or pass truncate='end' (keep the beginning) or 'start' (keep the end)"
        )
        self.index = index
        self.num_tokens = num_tokens
        self.max_length = max_length


def _load(path: Path) -> Tokenizer:
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a bad file
        if not path.exists():
            raise ModelLoadError(f"{path}: file not found (expected a fast tokenizer)") from None
        raise ModelLoadError(f"{path}: not a valid tokenizer.json ({e})") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


class TextTokenizer:
    def __init__(self, tokenizer_path: Path, max_length: int) -> None:
        self.max_length = max_length
        self._full = _load(tokenizer_path)
        # NOTE: separate instances per truncation side, since truncation is tokenizer state and
        # the gateway tokenizes from several threads.
        self._keep_start = _load(tokenizer_path)
        self._keep_start.enable_truncation(max_length, direction="right")
        self._keep_end = _load(tokenizer_path)
        self._keep_end.enable_truncation(max_length, direction="left")

    @property
    def vocab_size(self) -> int:
        return int(self._full.get_vocab_size(with_added_tokens=True))

    def encode(self, texts: Sequence[str], *, truncate: Truncate = False) -> list[list[int]]:
        """Token ids per text, special tokens included; raises InputTooLong without `truncate`."""
        encodings = self._full.encode_batch_fast(list(texts))
        ids = [e.ids for e in encodings]
        too_long = [i for i, seq in enumerate(ids) if len(seq) > self.max_length]
        if not too_long:
            return ids
        if truncate is False:
            i = too_long[0]
            raise InputTooLong(i, len(ids[i]), self.max_length)
        tok = self._keep_start if truncate == "end" else self._keep_end
        redone = tok.encode_batch_fast([texts[i] for i in too_long])
        for i, enc in zip(too_long, redone, strict=True):
            ids[i] = enc.ids
        return ids

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._full.encode_batch_fast(list(texts))]
