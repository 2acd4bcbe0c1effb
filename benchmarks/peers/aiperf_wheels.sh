#!/usr/bin/env bash
# NVIDIA AIPerf (PyPI aiperf) for the GPU machine, as wheels to carry (.carry/aiperf, git-ignored):
# aiperf itself and, transitively, each requirement the GPU image lacks (image_packages.txt,
# compared by normalized name), for CPython 3.12 on manylinux x86-64. benchmarks/peers/AIPERF.md
# says what is dropped and why, the sizes, and how benchmarks/harness/aiperf_run.py installs and
# runs it.
#   bash benchmarks/peers/aiperf_wheels.sh [.carry/aiperf]
# The requirements are walked here from each wheel's METADATA (Requires-Dist, markers evaluated
# for CPython 3.12 on Linux x86-64, no extras), each one fetched with `pip download --no-deps`:
# pip never downloads the image's packages (pandas, transformers, ...: ~180 MiB it would skip).
# A requirement the image has, or one named in DROP, is not followed: DROP's packages serve
# features `aiperf profile --endpoint-type embeddings --ui none` does not load (plots and their
# dashboard, the textual UI, the Kubernetes operator, Optuna search, HF datasets, audio, the API
# service, zstd transfers); AIPERF_DROP="" carries everything (~51 MiB). DEST's wheels are
# replaced on each run: give it a folder of its own.
set -euo pipefail
DEST=${1:-.carry/aiperf}
PY=${PYTHON:-python3}
VERSION=${AIPERF_VERSION:-0.13.0}
IMAGE=${IMAGE_PACKAGES:-$(dirname "$0")/image_packages.txt}
DROP=${AIPERF_DROP-plotly dash dash-bootstrap-components kaleido textual kopf kubernetes-asyncio \
aiosqlite optuna datasets soundfile fastapi uvicorn starlette-compress python-multipart zstandard}
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" - "$DEST" "aiperf==$VERSION" "$IMAGE" "$DROP" <<'PY'
import os, re, shutil, subprocess, sys, tempfile, zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename

dest, root, image_file, drop = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
image = {canonicalize_name(re.split(r"[=<>!~ ;\[]", line.split("#")[0].strip())[0])
         for line in image_file.read_text().splitlines() if line.split("#")[0].strip()}
dropped_names = {canonicalize_name(n) for n in drop.split()}
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
       "implementation_version": "3.12.3", "platform_python_implementation": "CPython",
       "platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux",
       "os_name": "posix", "platform_release": "", "platform_version": "", "extra": ""}
PIP = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
       "--python-version", "3.12", "--implementation", "cp",
       "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
       "--platform", "manylinux2014_x86_64"]


def fetch(req: Requirement) -> Path:
    spec = f"{req.name}{req.specifier}"  # the marker is already evaluated; extras: requires()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*PIP, "-d", tmp, spec], check=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            sys.exit(f"pip download {spec}: expected one wheel, got {sorted(os.listdir(tmp))}")
        wheel = wheels[0]
        return Path(shutil.move(str(wheel), dest / wheel.name))


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**ENV, "extra": e}) for e in {"", *extras}):
            out.append(req)
    return out


chosen: dict[str, tuple[Path, str]] = {}  # name -> (wheel, version)
extras_done: dict[str, set[str]] = {}  # name -> the extras whose requirements are queued
skipped: dict[str, set[str]] = {"image": set(), "drop": set()}
queue = [("(root)", Requirement(root))]
while queue:
    parent, req = queue.pop(0)
    name = canonicalize_name(req.name)
    if name in image:
        skipped["image"].add(name)
        if req.extras:  # the image's copy, but an extra's requirements may be missing there
            wheel = fetch(req)
            base = {str(r) for r in requires(wheel, set())}
            queue += [(f"{name}[{','.join(sorted(req.extras))}]", r)
                      for r in requires(wheel, set(req.extras)) if str(r) not in base]
            wheel.unlink()
        continue
    if name in dropped_names:
        skipped["drop"].add(f"{name} (for {parent})")
        continue
    if name in chosen:
        wheel, version = chosen[name]
        if not req.specifier.contains(version, prereleases=True):
            sys.exit(f"conflict: {name} {version} fails {parent}'s {req.specifier}")
        new = set(req.extras) - extras_done[name]
        if new:  # reached again with other extras: their requirements too
            base = {str(r) for r in requires(wheel, extras_done[name])}
            queue += [(name, r) for r in requires(wheel, new) if str(r) not in base]
            extras_done[name] |= new
        continue
    wheel = fetch(req)
    chosen[name] = (wheel, str(parse_wheel_filename(wheel.name)[1]))
    extras_done[name] = set(req.extras)
    queue += [(name, r) for r in requires(wheel, set(req.extras))]

total = 0
manifest = []
for name, (wheel, version) in sorted(chosen.items(), key=lambda kv: -kv[1][0].stat().st_size):
    size = wheel.stat().st_size
    total += size
    manifest.append(f"{size / 2**20:7.2f} MiB  {wheel.name}")
manifest.append(f"{total / 2**20:7.2f} MiB  total, {len(chosen)} wheels")
manifest.append("not carried, in the image: " + " ".join(sorted(skipped["image"])))
manifest.append("not carried, dropped: " + ", ".join(sorted(skipped["drop"])))
(dest / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
print("\n".join(manifest))
PY
