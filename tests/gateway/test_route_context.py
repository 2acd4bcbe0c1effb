"""The gateway's app imports its route modules; they are typed against `context.RouteContext`
and never import the app back, not even for type checking (issue 38: app, classify, dropin and
the OpenAPI modules imported each other in a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import embedserve.gateway

GATEWAY = Path(embedserve.gateway.__file__).parent


def gateway_imports(module: str) -> set[str]:
    """The `embedserve.gateway.*` modules `module` imports anywhere in its file."""
    tree = ast.parse((GATEWAY / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("embedserve.gateway."):
                found.add(node.module.removeprefix("embedserve.gateway."))
            elif node.module == "embedserve.gateway":
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("embedserve.gateway."):
                    found.add(alias.name.removeprefix("embedserve.gateway."))
    return found


def test_no_module_the_app_imports_imports_the_app_back() -> None:
    seen, todo = set(), ["app"]
    while todo:  # everything the app reaches, transitively
        for module in gateway_imports(todo.pop()) - seen:
            seen.add(module)
            todo.append(module)
    assert {"classify", "dropin", "context"} <= seen
    assert "app" not in seen, "a module the app imports imports the app"
