"""Command-line options as frozen dataclasses: each config declares its defaults and flags once.

A config's fields are its flags (`max_batch_tokens` -> `--max-batch-tokens`): type, default, help
and choices come from the field (`option(...)`). `add_arguments` registers them on a parser,
`from_args` builds the config from the parsed namespace, and `to_argv` renders a config back into
the flags that rebuild it (values other than the defaults only), which is how `serve` starts its
children. A field whose type is itself an `Options` class contributes that class's flags (a
server's `EngineOptions`); flags of one parser share one namespace, so names are unique across
the configs a command combines, and two configs that take the same value (`--model`) read it
from the same flag.

No torch here: the gateway's config is one of these.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Collection, Sequence
from typing import Any, Self

from embedserve.loading.bundled import BUNDLED, DEFAULT_MODEL
from embedserve.loading.spec import ATTENTION_KINDS, POOLING_METHODS


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    choices: Sequence[str] | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    aliases: Sequence[str] = (),
    first_as: str | None = None,
) -> Any:
    """A config field that is also a flag: `--<flag>` (default: the field's name, dashed).

    No default: a required flag. A `tuple[...]` field is a repeatable flag; a `bool` one a switch
    (`--X`), and a `bool | None` one, default None, a choice of three (`--X`, `--no-X`, neither).
    `aliases`: old names of a (single-valued) flag that still work, with a deprecation note on
    stderr when used. `first_as`: a repeatable flag's first value is also the value of the
    (single-valued) field of that name in the configs parsed with it (`serve --model A --model
    B`: the gateway's models, and the engine's `model` A).
    """
    metadata = {
        "help": help,
        "choices": choices,
        "flag": flag,
        "metavar": metavar,
        "aliases": tuple(aliases),
        "first_as": first_as,
    }
    return dataclasses.field(default=default, metadata=metadata)


def model_option() -> Any:
    known = ", ".join(f"{k}: {v[1]} ({v[2]})" for k, v in BUNDLED.items())
    return option(
        DEFAULT_MODEL, f"model folder, bundled name ({known}) or Hugging Face Hub id (org/name)"
    )


def drain_option() -> Any:
    return option(30.0, "on SIGTERM / Ctrl-C, how long in-flight requests may take (s)")


class _RenamedFlag(argparse.Action):
    """Stores a value like argparse's default action, and says so when an old name was used."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = self.option_strings[0]
        if option_string is not None and option_string != current:
            print(f"embedserve: {option_string} is deprecated; use {current}", file=sys.stderr)
        setattr(namespace, self.dest, values)


class _AppendFirstAs(argparse.Action):
    """Appends like argparse's "append", and stores the first value under a second name."""

    def __init__(self, *args: Any, first_as: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_as = first_as

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, items)
        setattr(namespace, self.first_as, items[0])


class Options:
    """Base of a frozen config dataclass whose fields are flags."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices is not None and value is not None and value not in choices:
                raise ValueError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, skip: Collection[str] = ()) -> None:
        """Register this config's flags (and its nested configs'), except the fields in `skip`."""
        for f, hint in _fields(cls):
            if f.name in skip:
                continue
            if _is_options(hint):
                hint.add_arguments(parser, skip=skip)
                continue
            kind, repeated = _scalar(hint)
            help_text = f.metadata["help"]
            if f.default not in (dataclasses.MISSING, None, (), False):
                help_text += f" (default: {f.default})"
            kw: dict[str, Any] = {"dest": f.name, "help": help_text}
            if kind is bool:  # `bool | None`, default None: --X / --no-X, or neither
                kw["action"] = (
                    "store_true" if f.default is False else argparse.BooleanOptionalAction
                )
            else:
                metavar = f.metadata["metavar"]
                if metavar is None and f.metadata["choices"] is None:
                    metavar = _flag(f)[2:].upper().replace("-", "_")
                kw.update(type=kind, choices=f.metadata["choices"], metavar=metavar)
                if repeated and f.metadata.get("first_as"):
                    kw.update(action=_AppendFirstAs, first_as=f.metadata["first_as"], default=None)
                elif repeated:
                    kw.update(action="append", default=None)
                else:
                    kw["default"] = None if f.default is dataclasses.MISSING else f.default
            kw["required"] = f.default is dataclasses.MISSING
            aliases = [f"--{a}" for a in f.metadata.get("aliases", ())]
            if aliases:
                if kind is bool or repeated:
                    raise TypeError(f"{f.name}: only a single-valued flag takes aliases")
                kw["action"] = _RenamedFlag
            parser.add_argument(_flag(f), *aliases, **kw)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> Self:
        """The config from parsed flags; `overrides` set fields directly.

        NOTE: a field reads the flag of its name whichever config declared it (one namespace per
        parser), and keeps its default where the parser has none: a field that means something
        else on this command must be given in `overrides`.
        """
        kwargs: dict[str, Any] = {}
        for f, hint in _fields(cls):
            if f.name in overrides:
                kwargs[f.name] = overrides[f.name]
            elif _is_options(hint):
                kwargs[f.name] = hint.from_args(args)
            elif hasattr(args, f.name):
                value = getattr(args, f.name)
                if _scalar(hint)[1]:
                    value = f.default if value is None else tuple(value)
                kwargs[f.name] = value
        return cls(**kwargs)

    def to_argv(self) -> list[str]:
        """The flags that rebuild this config: every value that is not the default."""
        argv: list[str] = []
        for f, hint in _fields(type(self)):
            value = getattr(self, f.name)
            if _is_options(hint):
                argv += value.to_argv()
            elif f.default is dataclasses.MISSING or value != f.default:
                kind, repeated = _scalar(hint)
                if kind is bool:
                    argv += [_flag(f) if value else _flag(f).replace("--", "--no-", 1)]
                elif repeated:
                    argv += [x for v in value for x in (_flag(f), str(v))]
                else:
                    argv += [_flag(f), str(value)]
        return argv


def option_key(cls: type, name: str) -> tuple[str, type]:
    """Field `name` of config `cls` as a key of a file (its flag, underscored: `num_replicas`
    is `replicas`) and the type of its value (`int` for `int | None`)."""
    f, hint = next((f, h) for f, h in _fields(cls) if f.name == name)
    return _flag(f)[2:].replace("-", "_"), _scalar(hint)[0]


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _is_options(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Options)


def _scalar(hint: Any) -> tuple[type, bool]:
    """(element type, repeated) of `str`, `int | None`, `tuple[str, ...]`, ..."""
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True
    if isinstance(hint, types.UnionType):  # X | None
        (kind,) = (a for a in typing.get_args(hint) if a is not type(None))
        return kind, False
    return hint, False


def _flag(f: dataclasses.Field[Any]) -> str:
    return "--" + (f.metadata["flag"] or f.name.replace("_", "-"))


@dataclasses.dataclass(frozen=True)
class EngineOptions(Options):
    """Which model, and how the engine runs it: `embed`, `server` and `serve` share these flags."""

    model: str = model_option()
    device: str = option("auto", "cpu, cuda, cuda:N, or auto (a GPU when present)")
    dtype: str | None = option(
        None,
        "float32 | bfloat16 | float16 (default: bfloat16 on a GPU and on a CPU with native "
        "bf16, AVX-512 BF16 or AMX, checked against fp32 at start-up; else float32)",
    )
    cpu_path: str | None = option(
        None,
        "a float32 CPU's executor: onnx (ONNX Runtime), packed (oneDNN prepacked weights) or "
        "eager (default: the fastest of them measured at start-up, or onnx for small batches "
        "and packed or eager for large ones where that is faster, when the dtype is float32 "
        "by default or asked with --cpu-path auto; an asked-for --dtype float32 alone runs "
        "eager)",
        choices=("auto", "onnx", "packed", "eager"),
    )
    pooling: str | None = option(None, "override the folder's pooling", choices=POOLING_METHODS)
    attention: str | None = option(
        None,
        "override the folder's attention (Qwen3 models; BERT is always bidirectional)",
        choices=ATTENTION_KINDS,
    )
    attention_backend: str | None = option(
        None,
        "the attention backend, e.g. varlen, sdpa_loop, block_mask (default: measured)",
        metavar="NAME",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValueError("model must name a folder or a bundled model")
        if not self.device:
            raise ValueError("device must be cpu, cuda, cuda:N or auto")
