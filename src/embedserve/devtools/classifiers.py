"""Sequence classifier folders for `make-checkpoint` (task "classify"): exact configs, random
weights made by transformers (as `family_checkpoints` makes every encoder family's).

- `minilm-l6-multilabel`: the 6-layer, 384-wide MiniLM-L6-H384 BERT shape that
  cross-encoder/ms-marco-MiniLM-L-6-v2 publishes, as a `BertForSequenceClassification` with the
  six labels of unitary/toxic-bert (`"problem_type": "multi_label_classification"`: one sigmoid
  per label) and the real BERT uncased vocabulary;
- `minilm-l6-sentiment`: the same shape with three labels (negative, neutral, positive) and no
  `problem_type` (softmax), as most published single-label classifiers ship;
- `xlm-roberta-classifier-tiny`: an `XLMRobertaForSequenceClassification` at the test width
  with three labels (softmax) and the real XLM-R tokenizer, for the RoBERTa head's names.
"""

from __future__ import annotations

from typing import Any

from embedserve.devtools.family_checkpoints import _TINY, _XLMR_BASE, EncoderArch

TOXIC_LABELS = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")
SENTIMENT_LABELS = ("negative", "neutral", "positive")

# cross-encoder/ms-marco-MiniLM-L-6-v2's BERT (MiniLM-L6-H384-uncased), without its head's keys
MINILM_L6: dict[str, Any] = {
    "architectures": ["BertForSequenceClassification"],
    "model_type": "bert",
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 384,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}


def labelled(config: dict[str, Any], labels: tuple[str, ...], **extra: Any) -> dict[str, Any]:
    """`config` with `id2label` / `label2id` for `labels` (in logit order) and `extra` keys."""
    return {
        **config,
        "id2label": {str(i): name for i, name in enumerate(labels)},
        "label2id": {name: i for i, name in enumerate(labels)},
        **extra,
    }


CLASSIFIER_ARCHS: dict[str, EncoderArch] = {
    "minilm-l6-multilabel": EncoderArch(
        labelled(MINILM_L6, TOXIC_LABELS, problem_type="multi_label_classification"),
        "bert-uncased",
    ),
    "minilm-l6-sentiment": EncoderArch(labelled(MINILM_L6, SENTIMENT_LABELS), "bert-uncased"),
    "xlm-roberta-classifier-tiny": EncoderArch(
        labelled(
            {
                **_XLMR_BASE,
                **_TINY,
                "intermediate_size": 128,
                "architectures": ["XLMRobertaForSequenceClassification"],
            },
            SENTIMENT_LABELS,
        ),
        "xlm-roberta",
    ),
}
