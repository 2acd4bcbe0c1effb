"""Gateway test fixtures: the request core on the bundled model, and the 4xx a call would get."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.core.tokenization import TextTokenizer
from embedserve.errors import InputError
from embedserve.gateway.errors import ApiError, from_input_error
from embedserve.loading.spec import read_model_spec


@pytest.fixture(scope="session")
def inputs(minilm_path: Path) -> InputPreparer:
    spec = read_model_spec(minilm_path)
    return InputPreparer(spec, TextTokenizer(minilm_path / "tokenizer.json", spec.max_seq_length))


def api_error(call: Callable[[], Any]) -> ApiError:
    """What the app answers for the error `call()` raises (a request-core one becomes a 400)."""
    try:
        call()
    except InputError as e:
        return from_input_error(e)
    except ApiError as e:
        return e
    raise AssertionError("no error raised")
