"""The vocabulary `/openapi.json` is written in: typed constructors of JSON schemas (each emits
its keys in one order: type, items, enum, bounds, pattern, sizes, default, description) and a
request body as a list of `Field`s, from which its object schema is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]
_UNSET: Any = object()  # no default


def _schema(kind: str | None, **keys: Any) -> Schema:
    """`kind` as "type", then the keys given (`_UNSET` or None: left out), in the order given."""
    out: Schema = {} if kind is None else {"type": kind}
    out.update({k: v for k, v in keys.items() if v is not None and v is not _UNSET})
    return out


def string(*, enum: Any = None, min_length: int | None = None, pattern: str | None = None,
           default: Any = _UNSET, description: str | None = None) -> Schema:  # fmt: skip
    return _schema("string", enum=_listed(enum), minLength=min_length, pattern=pattern,
                   default=default, description=description)  # fmt: skip


def integer(*, minimum: int | None = None, maximum: int | None = None,
            description: str | None = None) -> Schema:  # fmt: skip
    return _schema("integer", minimum=minimum, maximum=maximum, description=description)


def number(*, minimum: float | None = None) -> Schema:
    return _schema("number", minimum=minimum)


def boolean(*, default: bool | None = None, description: str | None = None) -> Schema:
    return _schema("boolean", default=default, description=description)


def array(items: Schema, *, min_items: int | None = None, max_items: int | None = None,
          default: Any = _UNSET, description: str | None = None) -> Schema:  # fmt: skip
    return _schema("array", items=items, minItems=min_items, maxItems=max_items,
                   default=default, description=description)  # fmt: skip


def choice(*values: Any, default: Any = _UNSET) -> Schema:
    """One of `values`, of whatever types (`truncate`'s false or a direction)."""
    return _schema(None, enum=list(values), default=default)


def one_of(*schemas: Schema) -> Schema:
    return {"oneOf": list(schemas)}


def _listed(values: Any) -> list[Any] | None:
    return None if values is None else list(values)


@dataclass(frozen=True)
class Field:
    """One field of a request body: its name, its value's schema, whether a request must send
    it (an optional field may also be sent as null: the server reads null as absent)."""

    name: str
    schema: Schema
    required: bool = False


def obj(*fields: Field) -> Schema:
    """An object of `fields` and no other (a nested one: its optional fields are not nullable)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [f.name for f in fields if f.required],
        "properties": {f.name: f.schema for f in fields},
    }


def body(*fields: Field) -> Schema:
    """A request body: an object of `fields` and no other, every optional field nullable
    (tests/e2e/test_openapi_exact.py checks both against the running app)."""
    nullable = [f if f.required else Field(f.name, {**f.schema, "nullable": True}) for f in fields]
    return obj(*nullable)


def fields(schema: Schema, *names: str) -> list[Field]:
    """The fields `names` of a body built by `body`, as they are there (another route's)."""
    required = schema["required"]
    return [Field(n, schema["properties"][n], n in required) for n in names]
