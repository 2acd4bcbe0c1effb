#!/usr/bin/env bash
# Builds the vLLM 0.22.0 bundle for the GPU machine (VLLM_BUNDLE.md): on a CPU machine with PyPI
# access, from the repository root:
#     bash benchmarks/peers/vllm_bundle.sh            # -> benchmarks/peers/.bundle/ (git-ignored)
# 1. `pip download --no-deps` of vllm==0.22.0 and, from its own Requires-Dist (transitively),
#    every wheel the GPU image lacks, for CPython 3.12 on manylinux x86-64 (vllm_resolve.py);
# 2. unpacks them into one site-packages-like folder;
# 3. drops from vLLM's wheel what an embedding / scoring run on a Hopper GPU never loads (DROPS);
# 4. tar + xz (the device decodes it with Python's lzma, no binary needed), split into parts of
#    PART_MIB (default 53: one part and the ~9 MiB working tree fit a call's 64 MiB, and the last
#    part leaves room for AIPerf's 14 MiB of wheels, .carry/aiperf);
# 5. MANIFEST.sha256 (each part and the joined archive) and sizes.txt.
# FA2 (for FA2-only models or a fallback) goes into optional parts of its own, fa2.*.
# NICE (default 10) and XZ_LEVEL (default 3: at -6, xz got through 100 MB of 465 in 6.5 min on the shared 2-core machine) can be set. Needs python3 with pip and packaging, xz.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/benchmarks/peers
B=${BUNDLE_DIR:-$HERE/.bundle}
PART_MIB=${PART_MIB:-53}
XZ_LEVEL=${XZ_LEVEL:-3}
NICE="nice -n ${NICE:-10}"
VLLM=0.22.0
# inside site/: never loaded on this workload (VLLM_BUNDLE.md, "What is left out")
DROPS=(
  vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so   # FA2: SM90 picks FA3 (fa_utils.get_flash_attn_version); own parts
  vllm/_moe_C.abi3.so                        # MoE ops; its import is wrapped in suppress(ImportError)
  vllm/vllm-rs                               # the Rust frontend, off unless VLLM_USE_RUST_FRONTEND=1
  'vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so'   # other Pythons' builds
  'vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so'
  'vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so'
  'vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so'
  xgrammar/lib/libxgrammar.a                 # 0.2.3's static library (65 MB): linked into nothing at run time
)
t0=$(date +%s)
mkdir -p "$B/wheels"
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
mib() { echo "scale=1; $(du -sb "$1" | cut -f1) / 1048576" | bc; }

stamp "download vllm==$VLLM"
ls "$B"/wheels/vllm-$VLLM-*.whl >/dev/null 2>&1 || $NICE python3 -m pip download -q --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$B/wheels" "vllm==$VLLM"
stamp "resolve and download what the image lacks"
$NICE python3 "$HERE/vllm_resolve.py" "$B/wheels" --json "$B/resolve.json"

stamp "unpack"
rm -rf "$B/site" "$B/fa2" "$B/parts"
mkdir -p "$B/site" "$B/fa2/vllm/vllm_flash_attn" "$B/parts"
for w in "$B"/wheels/*.whl; do
  $NICE python3 - "$w" "$B/site" <<'PY'
import sys, zipfile, shutil
from pathlib import Path
wheel, site = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    z.extractall(site)
# a wheel's <name>.data/{purelib,platlib} belong in site-packages; scripts/headers/data do not
for data in site.glob("*.data"):
    for kind in ("purelib", "platlib"):
        for p in (data / kind).glob("*") if (data / kind).is_dir() else []:
            shutil.copytree(p, site / p.name, dirs_exist_ok=True) if p.is_dir() else shutil.copy2(p, site)
    shutil.rmtree(data)
PY
done
echo "unpacked: $(mib "$B/site") MiB" | tee "$B/sizes.txt"
echo "vllm unpacked: $(mib "$B/site/vllm") MiB" | tee -a "$B/sizes.txt"

stamp "drop"
mv "$B/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$B/fa2/vllm/vllm_flash_attn/"
for d in "${DROPS[@]:1}"; do rm -f "$B/site/$d"; done
find "$B/site" -name __pycache__ -prune -exec rm -rf {} +
echo "after drops: $(mib "$B/site") MiB (vllm $(mib "$B/site/vllm") MiB)" | tee -a "$B/sizes.txt"

stamp "compress (xz -$XZ_LEVEL)"
( cd "$B" && tar -C site -cf - . | $NICE xz -T2 -"$XZ_LEVEL" -c > parts/site.tar.xz )
( cd "$B" && tar -C fa2 -cf - . | $NICE xz -T2 -"$XZ_LEVEL" -c > parts/fa2.tar.xz )
echo "compressed: site $(mib "$B/parts/site.tar.xz") MiB, fa2 $(mib "$B/parts/fa2.tar.xz") MiB" \
  | tee -a "$B/sizes.txt"

stamp "split into ${PART_MIB} MiB parts"
( cd "$B/parts" && split -b "${PART_MIB}M" -d -a 2 site.tar.xz site.part- \
  && split -b "${PART_MIB}M" -d -a 2 fa2.tar.xz fa2.part- \
  && sha256sum site.tar.xz fa2.tar.xz site.part-* fa2.part-* > MANIFEST.sha256 \
  && rm site.tar.xz fa2.tar.xz )
echo "parts: $(cd "$B/parts" && ls site.part-* | wc -l) site, $(cd "$B/parts" && ls fa2.part-* | wc -l) fa2" \
  | tee -a "$B/sizes.txt"
( cd "$B/parts" && ls -l site.part-* fa2.part-* ) | tee -a "$B/sizes.txt"
stamp "done" | tee -a "$B/sizes.txt"
