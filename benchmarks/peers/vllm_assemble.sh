#!/usr/bin/env bash
# The device side of the vLLM bundle (VLLM_BUNDLE.md, "Device calls"). Each call carries one or
# more parts (with MANIFEST.sha256) in a folder of the working tree; this copies them into a
# scratch folder outside the tree, which lasts while the machine stays warm, checks each against
# the manifest and, once every part of the set is there, joins them, checks the whole archive,
# unpacks it (Python's tarfile + lzma: no xz binary needed) and prints the PYTHONPATH to use.
#     bash benchmarks/peers/vllm_assemble.sh .carry/vllm-part      # each call, the part it carries
#     eval "$(bash benchmarks/peers/vllm_assemble.sh --env)"        # later: PYTHONPATH, if installed
#     bash benchmarks/peers/vllm_assemble.sh --check DIR   # the image's versions vs resolve.json in DIR
# Exit status: 0 installed (now or earlier), 3 parts still missing (named), 1 a check failed.
# SCRATCH (default /tmp/vllm-bundle) holds the parts; SITE (default /tmp/vllm-site) the install.
# WITH_FA2=1 also waits for, and installs, the optional fa2.part-* set.
set -uo pipefail
SCRATCH=${SCRATCH:-/tmp/vllm-bundle}
SITE=${SITE:-/tmp/vllm-site}
say() { echo "vllm_assemble: $*"; }
env_line() { echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"; }
if [ "${1:-}" = "--env" ]; then
  [ -f "$SITE/.installed" ] || { say "not installed in $SITE" >&2; exit 3; }
  env_line; exit 0
fi
check_image() {  # the image's packages vLLM asked for, against their requirements (resolve.json)
  PYTHONPATH=$SITE python3 - "$1" <<'PY'
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
doc = json.load(open(sys.argv[1]))
bad = []
for name, entry in doc["from_image"].items():
    for line in entry["requirements"]:
        req = Requirement(line.split(": ", 1)[1])  # markers were evaluated for the device already
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            bad.append(f"{req} (asked by {line.split(':')[0]}): not installed")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            bad.append(f"{req} (asked by {line.split(':')[0]}): have {have}")
print("vllm_assemble: image packages vs requirements:", "all met" if not bad else "")
for b in bad:
    print("   ", b)
PY
}
if [ "${1:-}" = "--check" ]; then check_image "${2:-.}/resolve.json"; exit 0; fi
mkdir -p "$SCRATCH"
if [ -n "${1:-}" ]; then
  src=$1
  [ -f "$src/MANIFEST.sha256" ] || { say "no MANIFEST.sha256 in $src"; exit 1; }
  cp "$src/MANIFEST.sha256" "$SCRATCH/"
  [ -f "$src/resolve.json" ] && cp "$src/resolve.json" "$SCRATCH/"
  for p in "$src"/*.part-*; do
    [ -e "$p" ] || continue
    name=$(basename "$p")
    want=$(awk -v n="$name" '$2 == n {print $1}' "$SCRATCH/MANIFEST.sha256")
    got=$(sha256sum "$p" | cut -d' ' -f1)
    [ -n "$want" ] && [ "$want" = "$got" ] || { say "$name: checksum $got, manifest ${want:-none}"; exit 1; }
    cp "$p" "$SCRATCH/$name" && say "$name received ($(du -m "$p" | cut -f1) MiB), checksum ok"
  done
fi
[ -f "$SCRATCH/MANIFEST.sha256" ] || { say "no parts received yet"; exit 3; }
sets=site; [ "${WITH_FA2:-0}" = 1 ] && sets="site fa2"
missing=()
for s in $sets; do
  for name in $(awk '{print $2}' "$SCRATCH/MANIFEST.sha256" | grep "^$s\.part-"); do
    [ -f "$SCRATCH/$name" ] || missing+=("$name")
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  say "waiting for: ${missing[*]} (have: $(cd "$SCRATCH" && ls *.part-* 2>/dev/null | tr '\n' ' '))"
  exit 3
fi
for s in $sets; do
  [ -f "$SITE/.installed-$s" ] && { say "$s already installed in $SITE"; continue; }
  t0=$(date +%s.%N)
  cat $(ls "$SCRATCH"/$s.part-* | sort) > "$SCRATCH/$s.tar.xz"
  want=$(awk -v n="$s.tar.xz" '$2 == n {print $1}' "$SCRATCH/MANIFEST.sha256")
  got=$(sha256sum "$SCRATCH/$s.tar.xz" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { say "$s.tar.xz: checksum $got, manifest $want"; exit 1; }
  mkdir -p "$SITE"
  python3 - "$SCRATCH/$s.tar.xz" "$SITE" <<'PY' || exit 1
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], filter="fully_trusted")  # our own archive, checksum verified
PY
  rm -f "$SCRATCH/$s.tar.xz"
  touch "$SITE/.installed-$s"
  say "$s installed in $SITE in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }') s ($(du -sm "$SITE" | cut -f1) MiB)"
done
touch "$SITE/.installed"
[ -f "$SCRATCH/resolve.json" ] && check_image "$SCRATCH/resolve.json"
env_line
