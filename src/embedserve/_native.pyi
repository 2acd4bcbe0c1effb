"""Types of the native request path (native/src/lib.rs, built by maturin into the package)."""

from collections.abc import Callable
from typing import Any

def pause_ns(rounds: int = ..., runs: int = ...) -> float: ...

class Tokenizer:
    """A model's `tokenizer.json` through the `tokenizers` crate: the Python package's ids."""

    ascii_twin: bool
    def __init__(self, path: str, max_length: int = ...) -> None: ...
    @staticmethod
    def from_str(json: str, max_length: int = ...) -> Tokenizer: ...
    def ids(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def encode_packed(self, texts: list[str]) -> tuple[bytes, bytes]: ...
    def encode_plain_batch(self, texts: list[str]) -> list[list[int]]: ...
    def pairs(
        self, query: str, docs: list[str], limit: int, truncate: str | None = ...
    ) -> list[tuple[str, list[int], int]] | None: ...
    @property
    def template(self) -> tuple[list[int], list[int]]: ...
    @property
    def pair_template(self) -> PairTemplate | None: ...

class PairTemplate:
    """A tokenizer's pair template: `before` + query + `between` + document + `after`; `join`
    is the one rule that joins (and cuts) a cross-encoder's pair (native/src/ivy/pairs.rs)."""

    before: list[int]
    between: list[int]
    after: list[int]
    def join(
        self, query: list[int], doc: list[int], limit: int, truncate: str | None = ...
    ) -> tuple[str, list[int], int]: ...

class ServedModel:
    """One model as `Gateway` serves it (native/src/lib.rs): Ivy answers its plain
    `POST /v1/embeddings` and `POST /embed` itself when `fast`, TEI's `/embed_sparse` when
    `sparse`, and a cross-encoder's plain `/v1/rerank`, `/rerank`, `/v1/score` and `/v2/rerank`
    when `reranker` is given (activation, typed, Cohere's rerank `truncate`), within its own
    bounds; queued on a Tulip of its own, whose engine thread calls `build() -> (step,
    batch_tokens, batch_wait_s, sparse)` first and then `step(*arrays) -> handle` per batch (the
    engine's `PackedBatch` arrays as little-endian bytearrays, in its field order; `sparse` the
    same arrays for a sparse request's vectors, or None). With `build` None, its `replicas`
    instead: server processes, each a unix socket's path or `HOST:PORT` (gRPC), each part sent
    to one (`native/src/link`)."""

    def __init__(
        self,
        tokenizer_json: str,
        build: Callable[[], tuple[Callable[..., Any], int, float, Callable[..., Any] | None]]
        | None,
        *,
        names: list[str],
        max_length: int,
        fast: bool,
        normalize: bool,
        sparse: bool,
        max_inputs: int,
        max_tokens: int,
        max_chars: int,
        window_chars: int,
        part_tokens: int,
        max_queued_tokens: int,
        reranker: tuple[str, bool, str] | None = ...,
        replicas: list[str] = ...,
    ) -> None: ...

class Gateway:
    """`serve`'s native front (native/src/lib.rs) for `models`, built in turn; a request that
    names a model (or, with one model, none) is answered by that model's; every other request
    goes to `front`. A method's `model` is a model's place in `models`."""

    port: int
    in_flight: int
    def __init__(
        self,
        models: list[ServedModel],
        front: Callable[[str, str, list[tuple[bytes, bytes]], Reply], Any],
        *,
        max_body_bytes: int,
        parts_in_flight: int,
        request_timeout: float,
        body_timeout: float,
        header_timeout: float,
        max_header_bytes: int,
        max_headers: int,
        max_connections: int,
        hosts: list[str],
        keys: list[bytes],
        latency_buckets: list[float],
        batch_wait_requests: int,
        host: str = ...,
        port: int = ...,
        threads: int = ...,
        lanes: tuple[int, int, int] | None = ...,
        traces: int = ...,
        avoid: tuple[int, float, float] = ...,
        link_secret: str | None = ...,
    ) -> None: ...
    def batch_tokens(self, model: int = ...) -> int: ...
    def queued_tokens(self, model: int = ...) -> int: ...
    def outstanding_tokens(self, model: int = ...) -> int: ...
    def replica_tokens(self, model: int = ...) -> list[int]: ...
    def serve(self) -> None: ...
    def stop(self) -> None: ...
    def drain(self) -> None: ...
    def take_counts(self) -> list[tuple[str, str, tuple[int, list[int], float, int, int]]]: ...
    def take_spans(
        self,
    ) -> tuple[list[tuple[str, bytes, bytes, bytes, int, int, int, dict[str, str | int]]], int]: ...
    def set_api_keys(self, keys: list[bytes]) -> None: ...
    def set_unnamed(self, embed: int | None, sparse: int | None, score: int | None) -> None: ...
    def submit(
        self,
        ids: bytes,
        cu_seqlens: bytes,
        callback: Callable[[bytes | None, int, float, float, str | None], None],
        bulk: bool = ...,
        token_types: bytes | None = ...,
        model: int = ...,
    ) -> bool: ...
    def call(
        self, work: Callable[[], None], tokens: int, bulk: bool = ..., model: int = ...
    ) -> bool: ...

class Reply:
    """A handed-over request's answer: `send(status, headers, body)`, once."""

    def send(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None: ...
