"""embedserve: a fast embedding and reranking server for small Transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from embedserve.embedder import Embedder
    from embedserve.errors import InputError, InputTooLong, InputTypeError
    from embedserve.scorer import Scorer

__all__ = ["Embedder", "InputError", "InputTooLong", "InputTypeError", "Scorer", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import embedserve.gateway` never pulls in torch through this package.
    if name == "Embedder":
        from embedserve.embedder import Embedder

        return Embedder
    if name == "Scorer":
        from embedserve.scorer import Scorer

        return Scorer
    if name in ("InputError", "InputTooLong", "InputTypeError"):
        from embedserve import errors

        return getattr(errors, name)
    raise AttributeError(name)
