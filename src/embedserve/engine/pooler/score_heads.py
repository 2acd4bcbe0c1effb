"""Score heads: a pooled row [S, H] to one raw relevance score per pair [S, 1] (a classifier:
one logit per label [S, L]), on the device.

- `ClassifierHead` (cross-encoders, `BertForSequenceClassification`): BERT's pooler (dense +
  tanh) on the CLS row, then the one-label classifier: the logit. An XLM-RoBERTa cross-encoder
  (bge-reranker-v2-m3) has the same computation under other names (`classifier.dense`, then
  `classifier.out_proj`): the family registry's `classifier_tensors` names them. A sequence
  classifier (task "classify", `labels.LabelSpec`) is the same head with one row per label.
- `YesNoHead` (LLM rerankers, Qwen3-Reranker style): the two rows of the output projection for
  the answer tokens "yes" and "no", sliced at load (never the vocabulary), on the last token's
  normed hidden state: raw score = yes logit - no logit, so that sigmoid(raw) is the softmax of
  the two logits' "yes" share, the reranker's probability.

Both run in float32 after pooling (pooled rows are float32), inside the CUDA graph. The
activation (sigmoid or identity; a classifier's softmax or sigmoid) is the caller's:
`spec.ScoreSpec.activation`, `labels.LabelSpec.activation`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelLoadError, ModelSpec
from embedserve.loading.tensor_names import TIED


class ClassifierHead(nn.Module):
    def __init__(self, hidden: int, num_labels: int = 1) -> None:
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, cls_rows: torch.Tensor) -> torch.Tensor:  # [S, H] fp32 -> [S, labels]
        return self.classifier(torch.tanh(self.pooler(cls_rows)))


class YesNoHead(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.rows = nn.Parameter(torch.empty(2, hidden))  # [yes, no] rows of the output projection

    def forward(self, last_rows: torch.Tensor) -> torch.Tensor:  # [S, H] fp32 -> [S, 1]
        logits = last_rows @ self.rows.T  # [S, 2]
        return logits[:, :1] - logits[:, 1:]


def _one(
    tensors: dict[str, torch.Tensor], names: list[str], shape: tuple[int, ...], folder: Path
) -> torch.Tensor:
    """The first of `names` the checkpoint holds, checked against `shape`."""
    for name in names:
        if name in tensors:
            t = tensors[name]
            if tuple(t.shape) != shape:
                raise ModelLoadError(
                    f"{folder}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}"
                )
            return t.float()
    raise ModelLoadError(f"{folder}: missing tensor {names[0]!r} (expected shape {list(shape)})")


def build_score_head(spec: ModelSpec, weights: FolderWeights | None = None) -> nn.Module | None:
    """The folder's score head (fp32, on the CPU), or None for an embedding model; its tensors
    through `weights` (by default a reader of its own)."""
    if spec.score is None and spec.labels is None:
        return None
    weights = weights or FolderWeights(spec)
    folder, h = spec.path, spec.hidden_size
    if spec.score is None or spec.score.kind == "classifier":
        n = spec.output_width  # 1 for a cross-encoder, else the classifier's labels
        # the family's names for the pooler (dense + tanh on CLS) and the classifier
        pooler, classifier = spec.family_row.classifier_tensors
        pooler_w, pooler_b = [p + "weight" for p in pooler], [p + "bias" for p in pooler]
        out_w, out_b = [c + "weight" for c in classifier], [c + "bias" for c in classifier]
        tensors = weights.tensors([*pooler_w, *pooler_b, *out_w, *out_b])
        head: nn.Module = ClassifierHead(h, n)
        state = {
            "pooler.weight": _one(tensors, pooler_w, (h, h), folder),
            "pooler.bias": _one(tensors, pooler_b, (h,), folder),
            "classifier.weight": _one(tensors, out_w, (n, h), folder),
            "classifier.bias": _one(tensors, out_b, (n,), folder),
        }
    else:
        assert spec.score is not None and spec.score.yes_no_ids is not None
        vocab = spec.vocab_size
        # an untied checkpoint has its own output projection; a tied one reuses the embeddings
        names = ["lm_head.weight", *TIED["lm_head.weight"]]
        if not getattr(spec.config, "tie_word_embeddings", True):
            names = names[:1]
        tensors = weights.tensors(names)
        table = _one(tensors, [n for n in names if n in tensors] or names, (vocab, h), folder)
        head = YesNoHead(h)
        state = {"rows": table[list(spec.score.yes_no_ids)].clone()}
    head.load_state_dict(state, strict=True)
    return head.eval()
