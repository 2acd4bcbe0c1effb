"""Engine-level timing on a GPU against Hugging Face eager: the inputs, the reference forward,
the hardware floor and the per-model table that `studies/engine_latency.py` and
`studies/families.py` share.

Engine time is CUDA-event time from before `step()` to after its device-to-host copy.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import row_cosines
from embedserve.engine.graphs import GraphConfig

from .timing import percentile as p

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/data/texts.py is real text

QWEN3_06B = dict(
    vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, intermediate_size=3072, max_position_embeddings=32768,
    rope_theta=1_000_000, rms_norm_eps=1e-6, tie_word_embeddings=True,
)  # fmt: skip
STDLIB_DOCS = ("argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email",
               "functools", "http.client", "inspect", "itertools", "json", "logging", "pathlib",
               "pickle", "re", "shutil", "socket", "sqlite3", "statistics", "string", "subprocess",
               "tarfile", "threading", "typing", "unittest", "urllib.request", "zipfile")  # fmt: skip
GRAPHS = GraphConfig(max_tokens=32768, max_block_mask_tokens=4096)


def real_text() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.data import texts

    lists = [v for k, v in vars(texts).items() if k.isupper() and isinstance(v, list)]
    parts = [x for v in lists for x in v if isinstance(x, str)]
    for mod in STDLIB_DOCS:
        m = importlib.import_module(mod)
        parts += [inspect.getdoc(m) or ""]
        parts += [inspect.getdoc(v) or "" for v in vars(m).values() if callable(v)][:40]
    return "\n\n".join(p for p in parts if len(p) > 40)


def token_stream(tokenizer_file: Path, text: str) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    # NOTE: a tokenizer.json may carry fixed padding and truncation (all-MiniLM-L6-v2's pads
    # and cuts every text at 128): without these two calls the stream held runs of [PAD] ids
    tok.no_padding()
    tok.no_truncation()
    ids = [tok.encode(chunk, add_special_tokens=False).ids for chunk in text.split("\n\n")]
    return np.fromiter((i for chunk in ids for i in chunk), dtype=np.int64)


def cut(stream: np.ndarray, seqlens: list[int], rng: np.random.Generator) -> PackedBatch:
    seqs = []
    for n in seqlens:
        start = int(rng.integers(0, len(stream) - n))
        seqs.append(stream[start : start + n].tolist())
    return PackedBatch.from_token_lists(seqs)


def time_ms(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        if hasattr(result, "wait"):
            result.wait()  # type: ignore[attr-defined]
        out.append(start.elapsed_time(end))
    return out


class HF:
    """Hugging Face eager forward + mean pooling on a padded batch, bidirectional by 4-D mask."""

    def __init__(self, model: torch.nn.Module, bidirectional_4d: bool) -> None:
        self.model, self.four_d = model, bidirectional_4d

    def inputs(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lens = batch.seqlens.tolist()
        width = max(lens)
        ids = torch.zeros(len(lens), width, dtype=torch.long)
        for i, (s, n) in enumerate(zip(batch.cu_seqlens[:-1].tolist(), lens, strict=True)):
            ids[i, :n] = torch.from_numpy(batch.input_ids[s : s + n])
        valid = torch.arange(width)[None, :] < torch.tensor(lens)[:, None]
        return ids.cuda(), valid.cuda(), valid[:, None, None, :].expand(-1, 1, width, -1).cuda()

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, valid: torch.Tensor, mask4: torch.Tensor) -> torch.Tensor:
        mask = mask4 if self.four_d else valid.long()
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        w = valid[..., None].float()
        return (hidden.float() * w).sum(1) / w.sum(1)


def measure_ceilings() -> dict[str, float]:
    a = torch.empty(2**30 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        b.copy_(a)
        x @ x
    copy = statistics.median(time_ms(lambda: b.copy_(a), 10))
    mm = statistics.median(time_ms(lambda: x @ x, 10))
    return {"copy_tb_s": 2 * 2**30 / copy / 1e9, "bf16_tflop_s": 2 * 8192**3 / mm / 1e9}


def floor_ms(params: int, hidden: int, layers: int, q_width: int, seqlens: list[int],
             ceil: dict[str, float]) -> float:  # fmt: skip
    tokens = sum(seqlens)
    byte_time = (2 * params + 2 * tokens * hidden) / (ceil["copy_tb_s"] * 1e12)
    flops = 2 * params * tokens + sum(4 * layers * n * n * q_width for n in seqlens)
    return 1e3 * max(byte_time, flops / (ceil["bf16_tflop_s"] * 1e12))


def bench_model(name: str, weights: str, engines: dict[str, Engine], hf: HF, stream: np.ndarray,
                workloads: list[tuple[str, list[int], int]], floor: Callable[[list[int]], float],
                records: list[dict[str, Any]], table: list[str]) -> None:  # fmt: skip
    rng = np.random.default_rng(0)
    for label, seqlens, reps in workloads:
        batch = cut(stream, seqlens, rng)
        tokens_field: int | str = (
            seqlens[0] if len(set(seqlens)) == 1 else f"{min(seqlens)}-{max(seqlens)}"
        )
        hf_in = hf.inputs(batch)
        ref = hf(*hf_in).cpu().numpy()
        hf_ms = time_ms(lambda hf_in=hf_in: hf(*hf_in), max(5, reps // 4))
        row = [label, f"{statistics.median(hf_ms):.2f}"]
        base = dict(model=name, weights=weights, dtype="bf16", batch=len(seqlens),
                    tokens=tokens_field, concurrency=1, scope="engine")  # fmt: skip
        records += [dict(system="hf-transformers", metric="p50_ms", value=round(p(hf_ms, 50), 4), **base),
                    dict(system="hf-transformers", metric="p99_ms", value=round(p(hf_ms, 99), 4), **base)]  # fmt: skip
        total = int(batch.num_tokens)
        if len(seqlens) > 1:
            records.append(dict(system="hf-transformers", metric="tokens_per_s",
                                value=round(total / p(hf_ms, 50) * 1e3), **base))  # fmt: skip
        for system, engine in engines.items():
            cos = min(float(row_cosines(engine.step(batch).wait(), ref).min()) for _ in range(3))
            ms = time_ms(lambda e=engine, b=batch: e.step(b), reps)
            recs = [dict(system=system, metric="p50_ms", value=round(p(ms, 50), 4), cosine_min=round(cos, 6), **base),
                    dict(system=system, metric="p99_ms", value=round(p(ms, 99), 4), cosine_min=round(cos, 6), **base)]  # fmt: skip
            if len(seqlens) > 1:
                recs.append(dict(system=system, metric="tokens_per_s", cosine_min=round(cos, 6),
                                 value=round(total / p(ms, 50) * 1e3), **base))  # fmt: skip
            replay = engine.runner.replay_ms(batch, 50) if engine.runner else None
            if replay is not None:  # the graph alone, back to back: no host work in between
                recs.append(dict(system=system, metric="mean_ms", value=round(replay, 4),
                                 note="graph replay only", **base))  # fmt: skip
            records += recs
            row += [
                f"{p(ms, 50):.3f} / {p(ms, 99):.3f} [{replay or float('nan'):.3f}]",
                f"{cos:.5f}",
            ]
            if len(seqlens) > 1:
                row[-2] += f" ({total / p(ms, 50) * 1e3 / 1e3:.0f}k tok/s)"
        row.append(f"{floor(seqlens):.3f}")
        table.append(f"| {name} | " + " | ".join(row) + " |")
        print(table[-1], flush=True)


def guarded(fn: Callable[[], Any]) -> Any:
    """Side measurements must not cost the main table: an error is recorded, not raised."""
    try:
        return fn()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
