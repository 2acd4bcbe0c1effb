"""A model's stated memory (`engine.memory`): weights counted from its tensors, estimated from
its checkpoint's headers before it loads, batch buffers growing with the token budget."""

from __future__ import annotations

from embedserve.engine.memory import checkpoint_elements, estimate, spec_batch_bytes, stated
from embedserve.memory import batch_bytes


def test_stated_weights_agree_with_the_checkpoint_estimate(minilm) -> None:  # type: ignore[no-untyped-def]
    engine = minilm.engine  # the bundled all-MiniLM-L6-v2 on the CPU, float32
    memory, device_now = stated(engine, "minilm", 2048)
    params = sum(p.numel() for p in engine.model.parameters())
    assert memory.weights_bytes >= 4 * params  # float32, buffers (positions) on top
    ahead = estimate(engine.spec, "minilm", "cpu", "float32", 2048)
    # the checkpoint holds a few tensors the engine does not build (BERT's unused pooler): the
    # estimate is above the stated weights, by less than 1%
    assert memory.weights_bytes <= ahead.weights_bytes < 1.01 * memory.weights_bytes
    assert ahead.batch_bytes == memory.batch_bytes
    assert (memory.workspace_bytes, device_now) == (0, {})  # the CPU: nothing measured
    half = estimate(engine.spec, "minilm", "cuda:0", "bfloat16", 2048)
    assert half.weights_bytes == checkpoint_elements(engine.spec.path) * 2


def test_batch_buffers_grow_with_the_budget(minilm) -> None:  # type: ignore[no-untyped-def]
    spec = minilm.engine.spec
    small, large = spec_batch_bytes(spec, 1024, 2), spec_batch_bytes(spec, 8192, 2)
    assert 8 * small <= large  # linear in tokens, and the attention bound grows with them
    cfg = spec.config
    assert small >= batch_bytes(1024, cfg.hidden_size, cfg.intermediate_size, 0, 2)
