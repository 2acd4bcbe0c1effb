"""The third-party packages vLLM's embedding and scoring paths import when their modules load:
a static reading of the unpacked wheel (no torch, no GPU needed), used by vllm_bundle.sh to
decide what the bundle must hold.

From a set of entry modules it follows every module-level `import` (also those inside `try:`
blocks, reported as `try`, and inside `if` blocks, reported as `if`: both load only when the
package is there or a condition holds; `if TYPE_CHECKING:` blocks skipped) through vLLM's own modules, and
lists the outside top-level names reached, each with one chain of modules that reaches it.
Imports inside functions are not followed: they load only when that function runs, so the list
is what `import` needs, and a lazily imported package can still be needed at run time (the
bundle keeps every small dependency for that reason; see VLLM_BUNDLE.md).

    python3 benchmarks/peers/vllm_imports.py SITE_DIR [--entry MODULE ...] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

# What `LLM(..., runner="pooling").embed/.score` and `vllm serve` of a pooling model load when
# their modules are imported (the engine core and GPU worker run in a child process).
ENTRIES = (
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.platforms.cuda",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.model_executor.models.bert",
    "vllm.model_executor.models.qwen3",
    "vllm.model_executor.models.adapters",
    "vllm.model_executor.layers.pooler",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.compilation.backends",
    "vllm.compilation.cuda_graph",
)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_imports(path: Path, module: str, is_pkg: bool) -> list[tuple[str, str]]:
    """(imported module, "" or "if" or "try") for every module-level import of one file."""
    tree = ast.parse(path.read_bytes(), str(path))
    out: list[tuple[str, str]] = []
    package = module if is_pkg else module.rpartition(".")[0]

    def visit(body: list[ast.stmt], guarded: str) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend((a.name, guarded) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                out.append((target, guarded))
                out.extend((f"{target}.{a.name}", guarded) for a in node.names)  # submodules
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body, guarded or "if")
                visit(node.orelse, guarded or "if")
            elif isinstance(node, ast.Try):
                visit(node.body, "try")
                for h in node.handlers:
                    visit(h.body, "try")
                visit(node.orelse, guarded)
                visit(node.finalbody, guarded)
            elif isinstance(node, (ast.With,)):
                visit(node.body, guarded)

    visit(tree.body, "")
    return out


def resolve(site: Path, module: str) -> tuple[Path, bool] | None:
    base = site.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def closure(site: Path, entries: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """Outside top-level name -> {"guard": "" (some import of it is unconditional), "if" or "try"
    (every import of it is inside such a block), "chain": the modules that reach it}."""
    rank = {"": 0, "if": 1, "try": 2}
    seen: dict[str, int] = {}  # module -> the least guard it was reached with
    outside: dict[str, dict[str, object]] = {}
    todo: list[tuple[str, list[str], str]] = [(e, [e], "") for e in entries]
    stdlib = set(sys.stdlib_module_names)
    while todo:
        module, chain, via = todo.pop()
        if module in seen and seen[module] <= rank[via]:
            continue
        seen[module] = rank[via]
        found = resolve(site, module)
        if found is None:
            continue
        path, is_pkg = found
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        parents = module.split(".")
        for i in range(1, len(parents)):
            todo.append((".".join(parents[:i]), chain, via))
        for target, guarded in module_imports(path, module, is_pkg):
            guard = max(via, guarded, key=rank.__getitem__)  # a guard holds for all beneath it
            top = target.split(".")[0]
            if not top or top in stdlib or top == "__future__":
                continue
            if top == "vllm":
                if resolve(site, target) is not None:
                    todo.append((target, [*chain, target], guard))
                continue
            entry = outside.setdefault(top, {"guard": guard, "chain": [*chain, target]})
            if rank[guard] < rank[entry["guard"]]:  # type: ignore[index]
                entry["guard"] = guard
                entry["chain"] = [*chain, target]
    return outside


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("site", type=Path, help="a folder holding vllm/ (the unpacked wheel)")
    ap.add_argument("--entry", action="append", default=None, help="entry module (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    found = closure(args.site, tuple(args.entry) if args.entry else ENTRIES)
    if args.json:
        print(json.dumps(found, indent=1, sort_keys=True))
        return
    for name in sorted(found):
        info = found[name]
        tag = {"": "needed", "if": "if", "try": "try"}[info["guard"]]  # type: ignore[index]
        print(f"{tag:6s} {name:28s} via {' -> '.join(info['chain'][-4:])}")  # type: ignore[index]


if __name__ == "__main__":
    main()
