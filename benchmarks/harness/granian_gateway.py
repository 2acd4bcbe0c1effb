"""The gateway's ASGI app built for another HTTP server (granian) to run: `app()` is a factory
that reads the gateway's flags from $ES_GATEWAY_ARGV (a JSON list) and returns `build_app`'s app,
the one uvicorn runs in `embedserve gateway`. A study's prototype, not a product path."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def app() -> Any:
    from embedserve.gateway.main import GatewayConfig, build_app

    parser = argparse.ArgumentParser()
    GatewayConfig.add_arguments(parser)
    args = parser.parse_args(json.loads(os.environ["ES_GATEWAY_ARGV"]))
    return build_app(GatewayConfig.from_args(args))
