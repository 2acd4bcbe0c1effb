"""Schema fuzzing of the HTTP API with schemathesis, against a real `embedserve serve`: every
operation of `GET /openapi.json`, generated requests (valid and invalid), and every response
checked against the schema: no 5xx, documented status codes, content types, headers and bodies
(`response_checks`).

Bounded for CI: derandomized hypothesis, `FUZZ_EXAMPLES` cases per operation. (A CLI run of
schemathesis 4.32 against `serve` with 30 examples plus its coverage phase: 808 cases, every
one conformant; one request of 2,048 inputs took more than its 10 s client timeout on the
2-core CPU, which is slowness, not an error.)

NOTE: driven through schemathesis' Python API with hypothesis' `given` rather than its pytest
plugin (`from_fixture`), which fails on pytest 9.
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

FUZZ_EXAMPLES = 25


def response_checks() -> list:  # type: ignore[type-arg]
    """What every response must satisfy: no server error; a status code, content type, headers
    and body the schema documents. Not the data checks (`positive_data_acceptance`): a request
    the schema allows may still be refused with a documented 400 (token ids above the served
    model's vocabulary, an input over its length limit, a prompt that is not one of its own)."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi import checks

    return [
        not_a_server_error,
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_headers_conformance,
        checks.response_schema_conformance,
    ]


def test_every_response_conforms_to_the_schema(each_served: str) -> None:
    schema = schemathesis.openapi.from_url(f"{each_served}/openapi.json")
    every_response = response_checks()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8, [f"{op.method} {op.path}" for op in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def conforms(case) -> None:  # type: ignore[no-untyped-def]
            # a generated request may hold 2,048 inputs: more than 10 s on a 2-core CPU
            case.call_and_validate(checks=every_response, timeout=120)

        conforms()
