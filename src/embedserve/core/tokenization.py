"""Text to token ids with the model's own `tokenizer.json`, and the truncation policy.

Pure CPU work with no torch import: the gateway and the offline `Embedder` share it (through
`inputs.InputPreparer`). Inputs longer than the model's limit are an error unless the caller asks
for truncation.

A long text is never tokenized whole to learn that it is over the limit, nor to keep one end of
it: a text over `whole_chars` characters is tokenized a piece at a time, its first (or, to keep
its end, its last) `window_chars` characters, the piece doubled until the tokens that cannot
depend on the cut number more than the limit (`_stable_count`), so the cost follows the tokens
needed rather than the string (a 14 MB string cost 17 s and 2 GB tokenized whole). The ids are
exactly those of the whole text: its truncation keeps tokens of the piece that the cut cannot
change (tests/core/test_hostile_inputs.py compares them to whole-text tokenization).

The doubling stops at `max_piece_chars`: a text with no place to cut before it (a run of
letters or digits with no space or punctuation, a hex or base64 blob of megabytes) is a 400
`unsplittable_text`, never tokenized whole (14 MB of hex cost 20-29 s and stalled other clients).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Encoding, Tokenizer

from embedserve._native import PairTemplate
from embedserve._native import Tokenizer as NativeTokenizer
from embedserve.errors import TRUNCATE_ADVICE, InputError, InputTooLong
from embedserve.loading.spec import ModelLoadError

Cut = Literal[False, "end", "start"]  # what the tokenizer does with an over-long text

# A text up to this many characters (or `CHARS_PER_TOKEN` per allowed token, if more) is
# tokenized whole, as it always was: cheap, and an over-long one is told its exact token count.
WHOLE_CHARS = 65536
CHARS_PER_TOKEN = 8  # the first piece of a longer text: most text has 3 to 5 per token
PIECE_DOUBLINGS = 2  # the largest piece read: four first pieces, or `WHOLE_CHARS`


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


class TooManyTokens(InputTooLong):
    """A long text over the limit, known from a piece of it: its whole count is not known."""

    def __init__(self, where: str, at_least: int, num_chars: int, max_length: int) -> None:
        InputError.__init__(
            self,
            f"{where} has more than {at_least - 1} tokens ({num_chars} characters), over this "
            f"model's limit of {max_length}; {TRUNCATE_ADVICE}",
            code="context_length_exceeded",
        )
        self.where = where
        self.num_tokens = at_least
        self.max_length = max_length


class UnsplittableText(InputError):
    """A long text with no place the tokenizer can cut it within `max_piece_chars`."""

    def __init__(self, where: str, num_chars: int, max_piece_chars: int) -> None:
        super().__init__(
            f"{where} has {num_chars} characters with no place to cut it in its first "
            f"{max_piece_chars} (a run of letters or digits with no space or punctuation, such "
            "as a hex or base64 blob): it is not tokenized; send text, or split it",
            code="unsplittable_text",
        )


class TextTokenizer:
    def __init__(
        self, tokenizer_path: Path, max_length: int, *, window_chars: int | None = None
    ) -> None:
        """`window_chars`: the first piece of a long text, and the length above which a text
        is cut in pieces (see the module docstring); tests make it small to cut texts
        everywhere."""
        self.max_length = max_length
        self._full = _load(tokenizer_path)
        # NOTE: separate instances per truncation side, since truncation is tokenizer state and
        # the gateway tokenizes from several threads.
        self._keep_start = _load(tokenizer_path)
        self._keep_start.enable_truncation(max_length, direction="right")
        self._keep_end = _load(tokenizer_path)
        self._keep_end.enable_truncation(max_length, direction="left")
        # each one's native twin (`embedserve._native`, the `tokenizers` crate with a WordPiece
        # fast path for clean ASCII): the same ids, the GIL released, 20x the package's rate
        self._native = {
            id(t): NativeTokenizer.from_str(t.to_str())
            for t in (self._full, self._keep_start, self._keep_end)
        }
        self.num_special = int(self._full.num_special_tokens_to_add(is_pair=False))
        full = self._native[id(self._full)]
        # the single-text template (the special tokens around a text) and the pair template
        # (`native/src/ivy/pairs.rs`: the one rule of a cross-encoder's pairs), read natively
        self._lead, self._trail = full.template
        self.pair_template: PairTemplate | None = full.pair_template
        # an added token cut by the piece's end tokenizes as other tokens: keep clear of it
        added = self._full.get_added_tokens_decoder().values()
        self._margin = max((len(t.content) for t in added), default=0) + 1
        self.window_chars = window_chars or CHARS_PER_TOKEN * (max_length + 1) + self._margin
        self.whole_chars = (
            self.window_chars if window_chars else max(WHOLE_CHARS, self.window_chars)
        )
        # the most characters of one text a piece holds: a text with no place to cut in that
        # many is refused (the module docstring); a text up to twice it may be read whole
        self.max_piece_chars = max(WHOLE_CHARS, self.window_chars << PIECE_DOUBLINGS)

    @property
    def json(self) -> str:
        """The tokenizer of a whole text as its JSON (no cut: the limit is checked, not
        applied), for the native front's tokenizer of plain requests (`cli/native.py`)."""
        return str(self._full.to_str())

    @property
    def vocab_size(self) -> int:
        return int(self._full.get_vocab_size(with_added_tokens=True))

    def encode(
        self, texts: Sequence[str], *, truncate: Cut = False, prompt: str = ""
    ) -> list[list[int]]:
        """Token ids of `prompt + text` per text, special tokens included; raises InputTooLong
        without `truncate`. `truncate="start"` keeps the prompt: an over-long text becomes the
        prompt's tokens and the end of the text's own, in the special tokens.

        NOTE: `prompt + text` is only built for a text tokenized whole: a copy of a 14 MB
        string is memory the allocator keeps.
        """
        texts = list(texts)
        if truncate == "start" and prompt:
            prompt_ids = self.encode_plain(prompt)
            return [
                ids
                if isinstance(ids, list) and len(ids) <= self.max_length
                else self._prompt_then_end(text, prompt_ids)
                for text, ids in zip(texts, self._untruncated(texts, prompt), strict=True)
            ]
        if truncate:
            return self._truncated(texts, truncate, prompt)
        out = []
        for i, (text, ids) in enumerate(zip(texts, self._untruncated(texts, prompt), strict=True)):
            if isinstance(ids, int):
                num_chars = len(prompt) + len(text)
                raise TooManyTokens(f"input[{i}]", ids, num_chars, self.max_length)
            if len(ids) > self.max_length:
                raise InputTooLong(f"input[{i}]", len(ids), self.max_length, TRUNCATE_ADVICE)
            out.append(ids)
        return out

    def _untruncated(self, texts: list[str], prompt: str) -> list[list[int] | int]:
        """Each `prompt + text`'s whole ids; for a long text a piece of which is over the limit
        already, how many tokens it has at least (an int)."""
        out: list[list[int] | int] = []
        whole = []
        need = self.max_length - self.num_special + 1
        for i, text in enumerate(texts):
            piece = self._piece(prompt, text, need, tail=False, where=f"input[{i}]")
            if piece is None:
                whole.append(i)
            out.append(0 if piece is None else piece[1] + self.num_special)
        ids = self._ids(self._full, [prompt + texts[i] for i in whole])
        for i, one in zip(whole, ids, strict=True):
            out[i] = one
        return out

    def _truncated(self, texts: list[str], truncate: Cut, prompt: str) -> list[list[int]]:
        """Each `prompt + text`'s ids, cut to the limit on the side `truncate` says: a long
        text's piece holds the tokens kept, exactly as the whole text does."""
        tok = self._keep_start if truncate == "end" else self._keep_end
        need = self.max_length - self.num_special
        cut = []
        for i, text in enumerate(texts):
            where = f"input[{i}]"
            # NOTE: cut above one window, not `whole_chars`: the ids are the same and a long
            # text's cost follows the tokens kept (a request of many 60k-character texts)
            piece = self._piece(prompt, text, need, tail=truncate == "start", where=where, whole=0)
            cut.append(prompt + text if piece is None else piece[0])
        return self._ids(tok, cut)

    def _ids(self, tok: Tokenizer, texts: list[str]) -> list[list[int]]:
        """`tok`'s ids of each text, made natively."""
        return self._native[id(tok)].encode_batch(texts)

    def _prompt_then_end(self, text: str, prompt_ids: list[int]) -> list[int]:
        """An over-long text's `truncate="start"` ids: the special tokens around the prompt's
        tokens and as many of the text's last tokens (tokenized alone) as fit."""
        room = self.max_length - self.num_special - len(prompt_ids)
        if room <= 0:
            raise InputError(
                f"the prompt takes {len(prompt_ids)} tokens and the special tokens "
                f"{self.num_special} of this model's limit of {self.max_length}: no room is "
                'left for the text truncate "start" keeps',
                param="prompt",
                code="context_length_exceeded",
            )
        piece = self._piece("", text, room, tail=True, where="the input")
        ids = self.encode_plain(text if piece is None else piece[0])
        return [*self._lead, *prompt_ids, *ids[-room:], *self._trail]

    def _piece(
        self,
        prompt: str,
        text: str,
        need: int,
        *,
        tail: bool,
        where: str,
        whole: int | None = None,
    ) -> tuple[str, int] | None:
        """For a `prompt + text` over `whole` (None: `whole_chars`) characters: the shortest of
        its first (`tail`: last) `window_chars` characters, doubled, whose tokens that the cut
        cannot change (`_stable_count`) number `need` at least, and that number. None for a
        shorter text, or when no piece shorter than the text has them: tokenize it whole.
        Raises `UnsplittableText` past `max_piece_chars` (the module docstring)."""
        total = len(prompt) + len(text)
        if total <= max(self.whole_chars if whole is None else whole, self.window_chars):
            return None
        n = self.window_chars
        while n < total:
            if n > self.max_piece_chars:
                raise UnsplittableText(where, total, self.max_piece_chars)
            if tail:
                piece = text[-n:] if n <= len(text) else prompt[total - n :] + text
            else:
                piece = prompt[:n] + text[: max(n - len(prompt), 0)]
            encoding = self._full.encode(piece, add_special_tokens=False)
            stable = _stable_count(encoding, n, self._margin, tail)
            if stable >= need:
                return piece, stable
            n *= 2
        return None

    def first_without_tokens(
        self, texts: Sequence[str], seqs: Sequence[Sequence[int]], prompt: str = ""
    ) -> int | None:
        """The index of the first text that gave no token of its own to its ids `seqs[i]`
        (`prompt + text` encoded with the special tokens): empty after the tokenizer's
        normalization ("\\u0000", whitespace for most tokenizers), embedded as "" would be; else
        None. Free without a prompt (a count); with one, a text whose ids are only the prompt's
        is tokenized alone when it is short enough to have merged into the prompt's last token
        (no longer than the longest token in the vocabulary)."""
        base = self.num_special + (len(self.encode_plain(prompt)) if prompt else 0)
        for i, ids in enumerate(seqs):
            if len(ids) > base:
                continue
            text = texts[i]
            if not prompt or len(text) > self._longest_token or not self.encode_plain(text):
                return i
        return None

    @functools.cached_property
    def _longest_token(self) -> int:
        """Characters of the vocabulary's longest token (the most a merge can swallow)."""
        return max(map(len, self._full.get_vocab(with_added_tokens=True)))

    def check_fits(self, texts: Sequence[str]) -> None:
        """`TooManyTokens` for the first long text a piece of which is over the limit already,
        before a caller tokenizes it whole (a contextualized document)."""
        need = self.max_length - self.num_special + 1
        for i, text in enumerate(texts):
            piece = self._piece("", text, need, tail=False, where=f"input[{i}]")
            if piece is not None:
                raise TooManyTokens(
                    f"input[{i}]", piece[1] + self.num_special, len(text), self.max_length
                )

    def encode_with_offsets(self, texts: Sequence[str]) -> list[Encoding]:
        """Whole encodings (character offsets, special-token masks), never truncated."""
        return list(self._full.encode_batch(list(texts)))

    def encode_plain_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with no special tokens, never truncated: the native ids of the whole
        text less the single-text template's (the post-processor only adds those). NOTE: native
        because a reranker's 25 documents of ~500 tokens took 16 ms through the package."""
        return self._native[id(self._full)].encode_plain_batch(list(texts))

    def pairs(
        self, query: str, docs: list[str], limit: int, truncate: str | None
    ) -> list[tuple[str, list[int], int]] | None:
        """A cross-encoder's pairs, tokenized and joined natively (`_native.Tokenizer.pairs`):
        None when the query has no token of its own."""
        return self._native[id(self._full)].pairs(query, docs, limit, truncate)

    def encode_plain(self, text: str) -> list[int]:
        """A text's ids with no special tokens (a prompt on its own)."""
        return self.encode_plain_batch([text])[0]


def no_token_of_its_own(where: str, param: str = "input") -> InputError:
    """The error for a text that `first_without_tokens` finds, as "" is refused: its vector or
    score would be the empty text's (issue 40 item 7). `where`: the text, as the caller named it."""
    return InputError(
        f"{where} is empty after the tokenizer's normalization (no token of its own: "
        "whitespace or control characters only)",
        param=param,
    )


def _stable_count(piece: Encoding, num_chars: int, margin: int, tail: bool) -> int:
    """How many of a piece's first (`tail`: last) tokens the whole text has there too.

    A tokenizer's normalizer, pre-tokenizer and model each work within a pre-token ("word")
    given the characters next to it, so only the word the cut falls in can tokenize differently
    in the whole text, and the word next to it (a regex's look-ahead, a run of spaces split
    before a word); and an added token the cut splits, within `margin` characters of the cut.
    """
    words, offsets = piece.word_ids, piece.offsets
    n = len(words)
    if n == 0:
        return 0
    if tail:
        edge, t = words[0], 0
        while t < n and (_near(words[t], edge) or offsets[t][0] < margin):
            t += 1
        return n - t
    edge, t = words[-1], n
    while t > 0 and (_near(words[t - 1], edge) or offsets[t - 1][1] > num_chars - margin):
        t -= 1
    return t


def _near(word: int | None, edge: int | None) -> bool:
    return word is None or edge is None or abs(word - edge) <= 1
