"""Each model as the native process serves it (`cli/native.py`): its inputs and what of its
requests Ivy answers (`Answered`), its engine as this process holds it (`Engine`: the Python
front's calls into its Tulip, its calls under the engine guard), the `build()` its Tulip's
engine thread calls first, and its `ServedModel`."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from embedserve.gateway.main import GatewayConfig
from embedserve.gateway.replicas import IN_PROCESS
from embedserve.gateway.requests import MAX_TOKENS_PER_REQUEST
from embedserve.gateway.scoring import RERANK_TRUNCATE
from embedserve.loading.retrieval_kinds import KIND_BY_NAME
from embedserve.processes import say
from embedserve.server.main import ServerConfig


def batch_budget(server: ServerConfig, measured: int | None, engine_tokens: int) -> int:
    """Tulip's tokens per batch: `--max-batch-tokens` when given, else the budget measured at
    start-up (the CPU's), else the engine's own (the server's rule, `ServerConfig.scheduler`)."""
    return server.scheduler(measured or engine_tokens).max_batch_tokens


class Engine:
    """Model `index`'s engine as this process holds it: the Python front's calls into its
    Tulip (its replica, `IN_PROCESS`) and its calls under the shared engine guard."""

    def __init__(self, loop: asyncio.AbstractEventLoop, guard: Any, index: int) -> None:
        from embedserve.server.tulip_calls import TulipCalls, Watch

        self.index = index
        self.calls = TulipCalls(loop, model=index)
        self.watch = Watch(guard)
        self.address = f"in-process:{index}"
        IN_PROCESS[self.address] = (
            self.calls.embed,
            self.calls.check,
            self.calls.outstanding_tokens,
        )


@dataclasses.dataclass(frozen=True)
class Answered:
    """What of the model's requests Ivy answers itself (`ivy::front::Served`)."""

    embeddings: bool  # plain dense embeddings
    sparse: bool  # TEI's plain /embed_sparse
    # a cross-encoder's (activation, typed, what Cohere's rerank routes do with a long document)
    reranker: tuple[str, bool, str] | None

    @property
    def any(self) -> bool:
        return self.embeddings or self.sparse or self.reranker is not None

    @property
    def what(self) -> str:
        """What the start-up line says Ivy answers."""
        return "scores" if self.reranker else "sparse vectors" if self.sparse else "embeddings"


def served_model(gateway: GatewayConfig, entry: Any) -> tuple[Any, Answered]:
    """A model's inputs and what Ivy answers of it: plain embeddings (or a sparse
    model's plain sparse vectors) when a request with no options asks nothing the request core
    would add (no prompt; float32 and every dimension for dense rows); a cross-encoder's plain
    scores (its activation, whether it has token types), its pairs joined natively. None of
    them under `--cache-size` or `--log-requests` (the cache and the request log are the Python
    front's): every request goes there."""
    from embedserve.gateway.served import load_model

    own = entry.limits
    limits, inputs, _ = load_model(
        entry, own["max_inputs"], own["max_chunks_per_document"], gateway.max_multivector_values
    )
    head, spec = inputs.head(), inputs.spec
    python_only = bool(gateway.cache_size or gateway.log_requests)
    unprompted = not python_only and limits.task == "embed" and inputs.options().prompt == ""
    plain = (
        unprompted
        and limits.retrieval is None
        and head.output_dtype == "float32"
        and head.dimensions == limits.hidden_size
    )
    kind = KIND_BY_NAME.get(limits.retrieval or "")
    # a ColBERT model's inputs take markers (`prepare_outputs`): none has sparse outputs
    sparse = unprompted and kind is not None and "sparse" in kind.outputs
    score, reranker = spec.score, None
    paired = inputs.tokenizer.pair_template is not None
    if not python_only and score is not None and score.kind == "classifier" and paired:
        typed = spec.type_vocab_size > 1  # segment embeddings: the document is type 1
        reranker = (score.activation, typed, RERANK_TRUNCATE)
    return inputs, Answered(plain, sparse, reranker)


def own_max_tokens(entry: Any) -> int:
    """A model's tokens per request (`--max-tokens-per-request`, else the default)."""
    return int(entry.limits["max_tokens_per_request"] or MAX_TOKENS_PER_REQUEST)


def builder(server: ServerConfig, engine: Engine, sparse: bool, name: str, built: Any) -> Any:
    """`build()` as Tulip's engine thread calls it first (the thread that then runs every
    step): checked to fit on its GPU beside the engines `built` before it (`gpu_memory`), the
    engine built, `engine.calls` given its record, the ready and memory lines said (a server
    process's); its `step`, batch tokens, batch wait (the server's) and, for Ivy's
    `/embed_sparse`, its sparse outputs, each under `engine.watch`."""
    from embedserve.cli.gpu_memory import check_memory, same_gpu
    from embedserve.engine.memory import reserved_on_gpus, stated
    from embedserve.server import main as server_main
    from embedserve.server.output_requests import MultivectorLimit
    from embedserve.server.service import launch
    from embedserve.server.tulip_calls import packed_step, sparse_step

    calls, watch = engine.calls, engine.watch

    def build() -> tuple[Any, int, float, Any]:
        check_memory(
            server, name, [(n, r) for n, c, r in built if same_gpu(c.engine.device, server)]
        )
        before = reserved_on_gpus()  # the engines built before this one, in this process
        model, measured = server_main._build_engine(server)
        calls.seam = model.seam()  # its `retrieval` is the spec (the engine's, the heads)
        calls.launch = watch(launch)
        calls.multivector_limit = MultivectorLimit.of(
            calls.seam.retrieval, server.max_multivector_values
        )
        budget = batch_budget(server, measured, model.batch_tokens)
        # what is served, in which precision (the line a server process says when ready)
        say(
            f"embedserve server: ready in this process (serving {name}: {calls.seam.serving}, "
            f"batch tokens {budget})"
        )
        index = (model.device.index or 0) if model.device.type == "cuda" else -1
        memory, device_now = stated(model, server.engine.model, budget, before.get(index, 0))
        say(f"embedserve server: memory on {memory.device}: {memory.describe()}")
        built.append((name, server, {"memory": memory.as_dict(), **device_now}))
        return (
            watch(packed_step(model)),
            budget,
            server_main.batch_wait_seconds(server, calls.seam.on_cpu),
            watch(sparse_step(calls.seam)) if sparse else None,
        )

    return build


def model_spec(
    server: ServerConfig, entry: Any, model: tuple[Any, Answered], engine: Engine, built: Any
) -> Any:
    """One model as the native front serves it with its engine in this process."""
    build = builder(server, engine, model[1].sparse, entry.names[0], built)
    return served_spec(entry, model, build, entry.limits["part_tokens"] or 0,
                       max_queued_tokens=server.max_queued_tokens)  # fmt: skip


def served_spec(
    entry: Any,
    model: tuple[Any, Answered],
    build: Any,
    part_tokens: int,
    max_queued_tokens: int = 0,
    replicas: tuple[str, ...] = (),
) -> Any:
    """One model as the native front serves it (`ServedModel`): its tokenizer, its engine's
    `build` (or its `replicas`' sockets), what Ivy answers of it and its own bounds
    (`part_tokens` 0: a batch of its engine's)."""
    from embedserve._native import ServedModel
    from embedserve.core.bounds import max_chars

    inputs, answered = model
    own = entry.limits
    return ServedModel(
        inputs.tokenizer.json,
        build,
        names=list(entry.names),
        max_length=inputs.tokenizer.max_length,
        fast=answered.embeddings,
        normalize=inputs.head().normalize,
        sparse=answered.sparse,
        max_inputs=own["max_inputs"],
        max_tokens=own_max_tokens(entry),
        # the character bounds of `core/bounds.text_chars` and `pair_chars`
        max_chars=max_chars(own_max_tokens(entry)),
        window_chars=inputs.tokenizer.window_chars,
        part_tokens=part_tokens,
        max_queued_tokens=max_queued_tokens,
        reranker=answered.reranker,
        replicas=list(replicas),
    )
