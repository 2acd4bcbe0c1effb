#!/usr/bin/env bash
# One device call of this session's GPU measurements (docs/gpu.md, "Running"): carried wheels
# installed, then the steps named as arguments (benchmarks/harness/steps.py), each writing under
# $OUT, run by benchmarks/run.py.
#   OLD_COMMIT=abc1234 bash benchmarks/gpu_run.sh tests breakdown breakdown-old serving encode
#   bash benchmarks/gpu_run.sh suites    # the four suites (benchmarks/run.py suites), under 10 minutes
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
export INFINITY_PATH=/tmp/site
if ls .carry/inf4/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/inf \
    .carry/inf4/*.whl && INFINITY_PATH=/tmp/inf:/tmp/site
fi
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# a newer transformers when carried (.carry/tfwhl: the CI's version, which has NomicBertModel),
# used only if it imports against the image's packages
if ls .carry/tfwhl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf .carry/tfwhl/*.whl \
    && PYTHONPATH=/tmp/tf:$PYTHONPATH python3 -c "import transformers; transformers.NomicBertModel" \
    && export PYTHONPATH=/tmp/tf:$PYTHONPATH
  python3 -c "import transformers; print('transformers', transformers.__version__)"
fi
[ $# -eq 0 ] || exec python3 benchmarks/run.py step "$@"
