"""The `embedserve` command: its parser and `main`. The commands: `embed`, `rerank` and `models`
in `cli.embed`; `index` in `cli.index`; `serve`, `server`, `gateway` in `cli.launch`;
`make-checkpoint` in `devtools.checkpoints`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE = """Embeddings and reranking with small Transformer models, fast, on GPUs or the CPU.

  embedserve serve                      serve the bundled all-MiniLM-L6-v2 over HTTP (OpenAI API)
  embedserve serve --model DIR          any supported Hugging Face / sentence-transformers folder
  embedserve embed "a text" "another"   embed offline, JSON out (--input FILE --output v.npy)
  embedserve rerank --query Q DOC ...   rank documents for a query, offline

Each command's --help lists its flags and their defaults. Docs: README.md, docs/serving.md."""


def build_parser() -> argparse.ArgumentParser:
    from embedserve import __version__

    parser = argparse.ArgumentParser(
        prog="embedserve", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"embedserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from embedserve.cli import embed, index, launch
    from embedserve.devtools import checkpoints

    embed.add_commands(sub)  # embed, rerank, models
    index.add_commands(sub)
    launch.add_commands(sub)
    checkpoints.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # the words as given (`serve --native` starts its process with them)
    args.given = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.run(args))
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"embedserve {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
