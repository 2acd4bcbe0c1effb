"""Types of the native request path (native/src/lib.rs, built by maturin into the package)."""

from collections.abc import Callable
from typing import Any

class Tokenizer:
    """A model's `tokenizer.json` through the `tokenizers` crate: the Python package's ids."""

    ascii_twin: bool
    def __init__(self, path: str, max_length: int = ...) -> None: ...
    @staticmethod
    def from_str(json: str, max_length: int = ...) -> Tokenizer: ...
    def ids(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def encode_packed(self, texts: list[str]) -> tuple[bytes, bytes]: ...

class Gateway:
    """`POST /v1/embeddings` and `GET /health` in front of `step(ids, cu_seqlens) -> handle`."""

    port: int
    def __init__(
        self,
        tokenizer: str,
        step: Callable[[bytes, bytes], Any],
        *,
        model: str,
        max_length: int,
        batch_tokens: int,
        max_body_bytes: int,
        max_inputs: int,
        host: str = ...,
        port: int = ...,
        threads: int = ...,
        max_queued_tokens: int = ...,
        normalize: bool = ...,
    ) -> None: ...
    def serve(self) -> None: ...
    def stop(self) -> None: ...
