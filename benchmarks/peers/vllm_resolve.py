"""The wheels vLLM needs beyond the GPU image: read vLLM's own `Requires-Dist` (and each
bundled package's, transitively), evaluated for the GPU machine (CPython 3.12, Linux x86-64),
skipping what the image has (image_packages.txt) and what an embedding or scoring run never
loads (DROP, each with its reason: VLLM_BUNDLE.md), and fetch each with
`pip download --no-deps` for that machine's platform. Used by vllm_bundle.sh.

    python3 benchmarks/peers/vllm_resolve.py WHEEL_DIR [--json FILE]

WHEEL_DIR holds vllm-0.22.0-*.whl already; the other wheels land beside it. The JSON report
lists every requirement met: bundled (name, version, who asked), satisfied by the image (with
the image's version when known, else "check on device"), or dropped (why).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import Marker  # noqa: F401  (evaluated through Requirement)
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            "--abi", "cp312", "--abi", "abi3", "--abi", "none"] + [
    x for n in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64",
                "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
                "manylinux_2_35_x86_64", "linux_x86_64", "any")
    for x in ("--platform", n)]  # fmt: skip
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
       "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip

# Never bundled: what vLLM's pooling path on a Hopper GPU with bf16 weights does not load
# (VLLM_BUNDLE.md, "What is left out", gives the evidence for each).
# NOTE: flashinfer-python (0.6.11.post2, 14 MB) and apache-tvm-ffi are bundled, not dropped:
# vLLM 0.22.0 imports `flashinfer` at load time (its sampler, pooling models too) and xgrammar
# imports `tvm_ffi`; without them neither `LLM` nor `vllm serve` starts (seen on the H200)
DROP = {
    "flashinfer-cubin": "FlashInfer's prebuilt kernels (361 MB): it JIT-compiles with the "
                        "image's nvcc instead",
    "tilelang": "vllm/_tilelang_ops.py only (sparse MLA / fp8 kernels)",
    "nvidia-cutlass-dsl": "CuTe-DSL kernels: FA4 (chosen on SM90 only for head size > 256 or "
                          "diff-KV sinks) and Mamba GDN kernels",
    "quack-kernels": "CuTe-DSL kernels for FA4 and Mamba GDN only",
    "tokenspeed-mla": "MLA attention (DeepSeek-style models) only",
    "humming-kernels": "the 'humming' quantization method and its MoE only",
    "nvidia-cudnn-frontend": "FlashInfer / FA4 benchmark code only",
    "fastsafetensors": "--load-format fastsafetensors only (import guarded by try)",
}  # fmt: skip


# Where the newest release of a requirement conflicts with another pin, the version pip's
# backtracking would settle on (this walker takes the newest of each and does not backtrack):
# vLLM pins apache-tvm-ffi==0.1.9, and xgrammar 0.2.6 and later ask for >=0.1.10 (0.2.5.post1
# asks for transformers<5), so pip installs xgrammar 0.2.3 beside vllm==0.22.0 on this image
PIN = {"xgrammar": "==0.2.3"}


def image_packages() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in (HERE / "image_packages.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version or None
    return out


def metadata(wheel: Path) -> tuple[str, str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(name).decode())
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


def wanted(reqs: list[str], extras: set[str]) -> list[Requirement]:
    out = []
    for text in reqs:
        r = Requirement(text)
        if r.marker is None:
            out.append(r)
            continue
        for extra in extras or {""}:
            if r.marker.evaluate({**ENV, "extra": extra}):
                out.append(r)
                break
    return out


def _existing(req: Requirement, dest: Path) -> Path | None:
    """A wheel of `req` already in `dest` that meets its specifier (a rerun downloads nothing)."""
    for w in dest.glob("*.whl"):
        name, version = w.name.split("-")[:2]
        if canonicalize_name(name) == canonicalize_name(req.name) and req.specifier.contains(
            Version(version), prereleases=True
        ):
            return w
    return None


def download(req: Requirement, dest: Path) -> Path | None:
    if (found := _existing(req, dest)) is not None:
        return found
    spec = f"{req.name}{req.specifier}"
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                           *PLATFORM, "-d", str(dest), spec],
                          capture_output=True, text=True)  # fmt: skip
    if (found := _existing(req, dest)) is not None:
        return found
    print(f"  no wheel for {spec}: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("wheels", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    image = image_packages()
    root = next(args.wheels.glob("vllm-*.whl"))
    _, version, reqs = metadata(root)
    todo = [(r, "vllm") for r in wanted(reqs, set())]
    bundled: dict[str, dict[str, object]] = {}
    from_image: dict[str, dict[str, object]] = {}
    dropped: dict[str, dict[str, object]] = {}
    problems: list[str] = []
    while todo:
        req, by = todo.pop(0)
        key = canonicalize_name(req.name)
        if key in DROP:
            dropped.setdefault(key, {"why": DROP[key], "asked_by": []})["asked_by"].append(by)  # type: ignore[union-attr]
            continue
        if key in image:
            have = image[key]
            entry = from_image.setdefault(key, {"image_version": have or "check on device",
                                                 "requirements": []})  # fmt: skip
            entry["requirements"].append(f"{by}: {req}")  # type: ignore[union-attr]
            if (
                have
                and req.specifier
                and not req.specifier.contains(Version(have), prereleases=True)
            ):
                problems.append(f"{by} wants {req}, the image has {have}")
            continue
        if key in bundled:
            entry = bundled[key]
            entry["asked_by"].append(f"{by}: {req}")  # type: ignore[union-attr]
            if req.specifier and not req.specifier.contains(
                Version(str(entry["version"])), prereleases=True
            ):
                problems.append(f"{by} wants {req}, bundled {entry['version']}")
            new_extras = set(req.extras) - set(entry["extras"])  # type: ignore[arg-type]
            if new_extras:
                entry["extras"] = sorted({*entry["extras"], *new_extras})  # type: ignore[misc]
                _, _, sub = metadata(Path(str(entry["wheel"])))
                todo += [(r, key) for r in wanted(sub, new_extras)
                         if r not in wanted(sub, set())]  # fmt: skip
            continue
        if key in PIN:
            req = Requirement(f"{req.name}{PIN[key]}")
        wheel = download(req, args.wheels)
        if wheel is None:
            problems.append(f"no wheel for {req} (asked by {by})")
            continue
        name, ver, sub = metadata(wheel)
        bundled[key] = {"version": ver, "wheel": str(wheel), "bytes": wheel.stat().st_size,
                        "asked_by": [f"{by}: {req}"], "extras": sorted(req.extras)}  # fmt: skip
        print(f"  {name} {ver} ({wheel.stat().st_size / 2**20:.1f} MiB) for {by}", flush=True)
        todo += [(r, key) for r in wanted(sub, set(req.extras))]
    report = {"vllm": version, "bundled": bundled, "from_image": from_image, "dropped": dropped,
              "problems": problems}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    total = sum(int(b["bytes"]) for b in bundled.values())  # type: ignore[call-overload]
    print(f"bundled {len(bundled)} wheels ({total / 2**20:.1f} MiB), {len(from_image)} from the "
          f"image, {len(dropped)} dropped; problems: {len(problems)}")  # fmt: skip
    for p in problems:
        print("  problem:", p)


if __name__ == "__main__":
    main()
