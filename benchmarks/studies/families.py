"""One latency line per model family on one GPU: embedserve against Hugging Face `transformers`
eager (sdpa attention, padded batch, mean or CLS pooling as the folder says) on the same
random-weight checkpoint of each family's published config, same inputs, one script run.

    PYTHONPATH=src python3 benchmarks/studies/families.py --tokenizer-from .carry/tok-bert --out DIR

Folders are built on the machine by `make_checkpoint` (transformers makes the weights, bf16);
the machine has none of the tokenizer packages, so every folder takes the BERT uncased
tokenizer of `--tokenizer-from` (its ids fit every family's vocabulary; the speed and the
agreement with transformers do not depend on which real tokenizer made the ids). Inputs: real
English text (Python stdlib docstrings and tests/data/texts.py). Workloads: one 128-token
query, and 100 passages of 32-256 tokens. Writes latency-<gpu>-families-<date>.json / .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import engine_bench as lat

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.devtools.family_checkpoints import ENCODER_ARCHS
from embedserve.engine.engine import Engine
from embedserve.loading.spec import read_model_spec

FAMILIES = {
    "xlm-roberta": "multilingual-e5-base",
    "mpnet": "all-mpnet-base-v2",
    "nomic-bert": "nomic-embed-text-v1.5",
    "modernbert": "modernbert-embed-base",
    "gemma3": "embeddinggemma-300m",
}


class PooledHF(lat.HF):
    """transformers eager on the padded batch, pooled as the folder says (mean or CLS)."""

    def __init__(self, model: torch.nn.Module, pooling: str) -> None:
        super().__init__(model, bidirectional_4d=False)
        self.pooling = pooling

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, valid: torch.Tensor, mask4: torch.Tensor) -> torch.Tensor:
        if self.pooling != "cls":
            return super().__call__(ids, valid, mask4)
        hidden = self.model(input_ids=ids, attention_mask=valid.long()).last_hidden_state
        return hidden[:, 0].float()


@torch.inference_mode()
def agreement(spec: Any, ours: Engine, hf_model: torch.nn.Module, batch: Any) -> dict[str, float]:
    """Min cosines on the passages batch against transformers on each sequence alone (no
    padding at all): ours (graphs), ours eager with FlashAttention and with per-sequence SDPA,
    and transformers' own padded batch."""
    seqs = [
        batch.input_ids[a:b]
        for a, b in zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:], strict=True)
    ]
    rows = []
    for seq in seqs:
        hidden = hf_model(input_ids=torch.from_numpy(seq)[None].cuda()).last_hidden_state[0]
        rows.append(hidden[0] if spec.pooling == "cls" else hidden.float().mean(0))
    alone = torch.stack(rows).float().cpu().numpy()
    hf = PooledHF(hf_model, spec.pooling)
    out = {"graphs": ours.step(batch).wait(), "hf_padded": hf(*hf.inputs(batch)).cpu().numpy()}
    for name in ("varlen", "sdpa_loop"):
        try:
            eager = Engine(
                spec, device="cuda", graphs=False, fidelity=False, attention_backend=name
            )
            out[f"eager_{name}"] = eager.step(batch).wait()
        except ValueError as e:
            print(f"eager {name}: {e}", flush=True)
    return {k: round(float(lat.row_cosines(v, alone).min()), 6) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--families", default=",".join(FAMILIES))
    args = ap.parse_args()
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = True
    ceil = lat.measure_ceilings()
    print("ceilings", ceil, flush=True)
    stream_text = lat.real_text()
    stream = lat.token_stream(args.tokenizer_from / "tokenizer.json", stream_text)
    records: list[dict[str, Any]] = []
    header = (
        "| model | workload | HF eager p50 ms | embedserve p50 / p99 [replay] ms | cos | floor ms |"
    )
    table = [header, "|" + "---|" * 6]
    notes: list[str] = []
    rng = np.random.default_rng(3)
    passages = [int(n) for n in rng.integers(32, 257, 100)]
    for family in args.families.split(","):
        arch = FAMILIES[family]
        cls = ENCODER_ARCHS[arch].config["architectures"][0]
        if not hasattr(transformers, cls):
            notes.append(f"{family}: skipped, transformers {transformers.__version__} has no {cls}")
            print(notes[-1], flush=True)
            continue
        folder = Path(f"/tmp/families/{arch}")
        t0 = time.perf_counter()
        make_checkpoint(folder, arch=arch, dtype="bfloat16", seed=0, overwrite=True,
                        tokenizer_from=args.tokenizer_from)  # fmt: skip
        built = time.perf_counter() - t0
        spec = read_model_spec(folder)
        if spec.dense:  # compared at the transformer's output: Dense runs after pooling
            spec = dataclasses.replace(spec, dense=(), hidden_size=spec.config.hidden_size)
        hf_model = transformers.AutoModel.from_pretrained(folder, dtype=torch.bfloat16)
        hf_model = hf_model.cuda().eval()
        t0 = time.perf_counter()
        ours = Engine(spec, device="cuda", graphs=lat.GRAPHS)
        startup = time.perf_counter() - t0
        msg = (f"{family} ({arch}): built in {built:.1f} s, engine start {startup:.1f} s, "
               f"fidelity cosine {ours.fidelity_cosine}")  # fmt: skip
        notes.append(msg)
        print(msg, flush=True)
        params = sum(t.numel() for n, t in hf_model.named_parameters() if "embed" not in n)
        cfg = spec.config
        heads = cfg.num_heads
        head_dim = getattr(cfg, "head_dim", cfg.hidden_size // heads)
        lat.bench_model(
            arch, "random", {"embedserve": ours}, PooledHF(hf_model, spec.pooling), stream,
            [("1 x 128", [128], 200), ("100 x 32-256", passages, 30)],
            lambda s, p=params, c=cfg, q=heads * head_dim: lat.floor_ms(
                p, c.hidden_size, c.num_layers, q, s, ceil
            ),
            records, table,
        )  # fmt: skip
        if ours.runner is not None:
            notes.append(f"{family} attention per bucket: {ours.runner.attention_choice()}")
        batch = lat.cut(stream, passages, np.random.default_rng(0))
        check = lat.guarded(functools.partial(agreement, spec, ours, hf_model, batch))
        notes.append(f"{family} 100 x 32-256 min cosine against transformers alone: {check}")
        print(notes[-1], flush=True)
        del ours, hf_model
        torch.cuda.empty_cache()
    for r in records:
        r["model"] = f"{r['model']} ({read_family(r['model'])})"
    software = report.versions("torch", "transformers", "triton")
    body = "\n".join(
        [
            "One line per family: each family's published config with random weights (bf16), "
            "built by transformers on the machine; transformers eager (sdpa, padded batch) "
            "against embedserve (graphs + fused ops) on the same folder and the same token ids "
            "(real English text through a BERT uncased tokenizer). cos: min cosine of ours "
            "against transformers' pooled output (Dense modules left out on both sides). "
            "floor: max(bytes / copy bandwidth, FLOPs / bf16 matmul rate) measured on the device.",
            "",
            *table,
            "",
            *[f"- {n}" for n in notes],
        ]
    )
    hw = torch.cuda.get_device_name()
    slug = report.card_slug() + "-families"
    path, _ = report.write("latency", hw, slug, records, software, body, args.out)
    print("\n".join(table))
    print(path)


def read_family(model: str) -> str:
    return next((f for f, a in FAMILIES.items() if a == model), "?")


if __name__ == "__main__":
    main()
