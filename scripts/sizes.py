"""The size rules of src/ (docs/architecture.md): no module over 450 lines, no function over
60 lines. Prints each offender and the largest of each; exit 1 if any.

    python3 scripts/sizes.py [src/embedserve]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def offenders(root: Path) -> tuple[list[str], tuple[int, str], tuple[int, str]]:
    found: list[str] = []
    largest_module, largest_function = (0, ""), (0, "")
    for path in sorted(root.rglob("*.py")):
        if "_pb2" in path.name:  # generated
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        name = path.relative_to(root).as_posix()
        if lines > MAX_MODULE_LINES:
            found.append(f"module {name}: {lines} lines")
        largest_module = max(largest_module, (lines, name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{name}:{node.lineno} {node.name}"
                if length > MAX_FUNCTION_LINES:
                    found.append(f"function {where}: {length} lines")
                largest_function = max(largest_function, (length, where))
    return found, largest_module, largest_function


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "src/embedserve")
    found, module, function = offenders(root)
    for line in found:
        print(line)
    print(f"largest module: {module[1]} ({module[0]} lines)")
    print(f"largest function: {function[1]} ({function[0]} lines)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
