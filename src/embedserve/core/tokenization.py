"""Text to token ids with the model's own `tokenizer.json`, and the truncation policy.

Pure CPU work with no torch import: the gateway and the offline `Embedder` share it (through
`inputs.InputPreparer`). Inputs longer than the model's limit are an error unless the caller asks
for truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Encoding, Tokenizer

from embedserve.errors import TRUNCATE_ADVICE, InputTooLong
from embedserve.loading.spec import ModelLoadError

Cut = Literal[False, "end", "start"]  # what the tokenizer does with an over-long text


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

    def encode(self, texts: Sequence[str], *, truncate: Cut = False) -> list[list[int]]:
        """Token ids per text, special tokens included; raises InputTooLong without `truncate`."""
        if truncate:  # one pass with the tokenizer that cuts on that side
            tok = self._keep_start if truncate == "end" else self._keep_end
            return [e.ids for e in tok.encode_batch_fast(list(texts))]
        ids = [e.ids for e in self._full.encode_batch_fast(list(texts))]
        for i, seq in enumerate(ids):
            if len(seq) > self.max_length:
                raise InputTooLong(f"input[{i}]", len(seq), self.max_length, TRUNCATE_ADVICE)
        return ids

    def encode_with_offsets(self, texts: Sequence[str]) -> list[Encoding]:
        """Whole encodings (character offsets, special-token masks), never truncated."""
        return list(self._full.encode_batch(list(texts)))

    def encode_pairs(self, first: str, seconds: Sequence[str]) -> list[Encoding]:
        """`first` paired with each of `seconds` by the tokenizer's pair template (special
        tokens and token types included), never truncated."""
        return list(self._full.encode_batch_fast([(first, s) for s in seconds]))

    def encode_plain_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with no special tokens, never truncated."""
        encodings = self._full.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def encode_plain(self, text: str) -> list[int]:
        """A text's ids with no special tokens (a prompt on its own)."""
        return list(self._full.encode(text, add_special_tokens=False).ids)
