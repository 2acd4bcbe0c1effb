#!/usr/bin/env bash
# The peers' small wheels for the GPU machine (.carry/peerwhl, installed by gpu_run.sh into
# /tmp/site): what `embedserve serve` and the FastAPI + sentence-transformers peer need there and
# the image lacks, for CPython 3.12 on x86-64, without their dependencies (the image has them).
#   bash benchmarks/peers/peer_wheels.sh [.carry/peerwhl]
# grpcio-health-checking is pinned to the image's grpcio (1.84.0, image_packages.txt's source:
# KINDS.md): 1.84.2's generated modules refuse to import under grpcio 1.84.0. pydantic-core is
# the exact version the downloaded pydantic asks for.
set -euo pipefail
DEST=${1:-.carry/peerwhl}
GRPCIO=${GRPCIO:-1.84.0}
PY=${PYTHON:-python3}
mkdir -p "$DEST"
get() {
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "$@"
}
get "grpcio-health-checking==$GRPCIO" uvicorn httptools orjson fastapi starlette pydantic \
  annotated-types typing-inspection
core=$(unzip -p "$DEST"/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core *\(==[^ ;]*\).*/\1/p' | head -1)
get "pydantic-core$core"
ls -la "$DEST"
