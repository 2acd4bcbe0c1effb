"""The gateway must never import torch: it runs where no torch is wanted (and starts fast)."""

from __future__ import annotations

import subprocess
import sys


def test_gateway_imports_and_builds_its_app_without_torch() -> None:
    code = (
        "import sys\n"
        "from embedserve.gateway.main import GatewayConfig, build_app, run\n"
        "import embedserve.gateway.app, embedserve.gateway.pipeline, embedserve.gateway.replicas\n"
        "import embedserve.cli.launch\n"
        "app = build_app(GatewayConfig(replicas=('127.0.0.1:1',)))\n"
        "assert app.limits.hidden_size == 384, app.limits\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
