#!/usr/bin/env bash
# Issue 55's GPU-host rows in device calls (docs/native.md): the carried native extension and
# the Python gateway's small wheels installed, then
#   null: the GPU tests (every `gpu`-marked one), and `serve --native` against the Python path
#         on the null engine at 1 / 16 / 64 connections (wrk);
#   real: `serve` and `serve --native` with the real engine on the GPU (studies/native_path.py);
#   replicas: the two-models e2e GPU test, then the real-engine study with two server processes
#         (`--replicas 2`), behind the Python gateway and behind the native front;
#   tokenizer: the tokenizer's rate at 1 / 4 / 16 threads;
#   rerank: the scoring suite's ms-marco MiniLM rows, /v1/rerank under serve and serve --native.
# carry: .carry (native/_native.abi3.so, or .so.xz: `strip -o` then `xz -9`; http-floor
# (benchmarks/floor), minilm-fp16, wrk/ with its libluajit, peerwhl for the Python path) and .whl
#   EMBEDSERVE_COMMIT=<hash> bash benchmarks/native_gpu.sh null|real|tokenizer|rerank
set -uo pipefail
# the extension may be carried xz-compressed (tonic makes it 7 MB stripped; the carry is 64 MiB)
if [ -f .carry/native/_native.abi3.so.xz ]; then
  xz -dc .carry/native/_native.abi3.so.xz > src/embedserve/_native.abi3.so || exit 1
else
  cp .carry/native/_native.abi3.so src/embedserve/_native.abi3.so || exit 1
fi
bash benchmarks/gpu_run.sh || exit 1 # the carried wheels into /tmp/site
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export LD_LIBRARY_PATH=$PWD/.carry/wrk${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
M=.carry/minilm-fp16
nvidia-smi -L
python3 -c "import embedserve._native as n; print('native extension', n.__file__)" || exit 1
case "${1:-null}" in
  null)
    EMBEDSERVE_MINILM=$M timeout 150 python3 -m pytest -q -m gpu tests/engine \
      -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"
    timeout 130 python3 benchmarks/studies/native_path.py --model $M --connections 1,16,64 \
      --wrk .carry/wrk/wrk --floor .carry/native/http-floor --out "$OUT"
    ;;
  tokenizer)
    timeout 150 python3 benchmarks/studies/tokenizer_rate.py --model $M --threads 1,4,16 \
      --rounds 7 --machine "$(python3 -c 'import torch; print(torch.cuda.get_device_name().split()[1].lower())')host" \
      --out "$OUT" | tail -7
    ;;
  rerank)
    timeout 250 python3 benchmarks/suites/scoring.py --device cuda --bert-tokenizer $M \
      --archs ms-marco-minilm-l6 --counts 5,25 --out "$OUT" 2>&1 | grep -v Warning | tail -5
    ;;
  real)
    timeout 290 python3 benchmarks/studies/native_path.py --model $M --connections 1,16,64 \
      --engine real --device cuda --wrk .carry/wrk/wrk --out "$OUT"
    ;;
  replicas)
    EMBEDSERVE_MINILM=$M timeout 150 python3 -m pytest -q -m gpu tests/e2e/test_native_gpu.py \
      -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/gpu-e2e.txt"
    timeout 400 python3 benchmarks/studies/native_path.py --model $M --connections 1,16,64 \
      --engine real --device cuda --replicas 2 --wrk .carry/wrk/wrk --out "$OUT"
    ;;
esac
