"""The engine: one model on one device, running packed batches.

`step()` launches a batch and returns a `LazyTensor` of pooled vectors without waiting for the
device; the head (truncate, normalize, encode) is applied per request by `outputs`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from embedserve.engine.attention import AttentionFn, RaggedLayout, choose_backend
from embedserve.engine.batch import PackedBatch
from embedserve.engine.lazy import LazyTensor
from embedserve.engine.models import build_model
from embedserve.engine.pooling import pool
from embedserve.spec import ModelSpec, read_model_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but no CUDA device is available")
    return dev


class Engine:
    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str | None = "auto",
        dtype: str | None = None,
        attention: str | None = None,
    ) -> None:
        self.spec = spec
        self.device = resolve_device(device)
        dtype_name = dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        if dtype_name not in DTYPES:
            raise ValueError(f"dtype {dtype_name!r} is not one of {', '.join(DTYPES)}")
        self.dtype = DTYPES[dtype_name]
        self.attend: AttentionFn = choose_backend(attention, self.device)
        self.model = build_model(spec).to(self.device, self.dtype)
        self.vocab_size = spec.vocab_size
        self.max_positions = spec.max_position_embeddings

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        *,
        pooling: str | None = None,
        attention_kind: str | None = None,
        **kwargs: str | None,
    ) -> Engine:
        """`attention_kind` ("causal" | "bidirectional") overrides the folder's; `attention`
        in kwargs names the attention backend."""
        spec = read_model_spec(folder, pooling=pooling, attention=attention_kind)
        return cls(spec, **kwargs)

    @property
    def hidden_size(self) -> int:
        return self.spec.hidden_size

    def check(self, batch: PackedBatch) -> None:
        """Reject a batch the model cannot run, before it reaches the device.

        NOTE: an out-of-range id on CUDA is a device-side assert that kills the process, so this
        check is what keeps one bad request from taking the server down.
        """
        if batch.num_tokens and (
            int(batch.input_ids.min()) < 0 or int(batch.input_ids.max()) >= self.vocab_size
        ):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        if batch.max_seqlen > self.max_positions:
            raise ValueError(
                f"a sequence of {batch.max_seqlen} tokens exceeds the model's "
                f"{self.max_positions} positions"
            )
        if int(batch.token_type_ids.max(initial=0)) >= self.spec.type_vocab_size:
            raise ValueError(f"token type ids must be below {self.spec.type_vocab_size}")

    @torch.inference_mode()
    def step(self, batch: PackedBatch) -> LazyTensor:
        """Run one packed batch; pooled float32 vectors [S, H] arrive in the returned handle."""
        self.check(batch)
        dev = self.device

        def to_dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev, non_blocking=True)

        cu_seqlens = to_dev(batch.cu_seqlens)
        layout = RaggedLayout(cu_seqlens, batch.max_seqlen, tuple(batch.seqlens.tolist()))
        hidden = self.model(
            to_dev(batch.input_ids),
            to_dev(batch.positions),
            to_dev(batch.token_type_ids),
            layout,
            self.attend,
        )
        pooled = pool(hidden, cu_seqlens, to_dev(batch.seq_ids), self.spec.pooling)
        return LazyTensor.from_device(pooled)
