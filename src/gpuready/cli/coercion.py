"""Typer's per-parameter coercion, without pydantic where the answer needs none.

Typer (>= 0.29) coerces every parameter of the command that runs, the unset ones included, through a pydantic
`TypeAdapter` it builds on first use (`_TyperParameter.get_runtime_param`, typer/_coercion.py), so any command
imports pydantic while parsing its arguments (about 0.1 s of CPU on the 2-core machine of docs/speed.md). Most
values need none of it: an unset option is None (or () for
a repeated option), a `str` option's value is the string given, an `int` or `float` option's default is that
number. `install()` gives each parameter a coercer that answers those, and a plain decimal for an `int` parameter,
as typer's adapter would (no parser, click type, bounds or clamp on the parameter), and hands every other value (a
number written as `8.0` or ` 8`, a float written out, a path, a flag) to typer's own adapter, built then. So what a
parameter accepts and the errors it gives are typer's. `gpuready.cli.app` installs it (in the CLI process); where
typer's internals differ, nothing is replaced. tests/cli/test_coercion.py compares its answers with typer's adapters.
"""

from __future__ import annotations

import re
from typing import Any

_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")  # what int() and pydantic's int read alike; at most 18 digits


class _Plain:
    """A one-value parameter's coercer: None and plain values here, everything else by typer's own adapter."""

    __slots__ = ("fallback", "kind", "multi")

    def __init__(self, kind: type | None, multi: bool) -> None:
        self.kind = kind  # str, int or float where values of that type are answered here, else None (only None is)
        self.multi = multi  # a parameter of several values (a repeated option, nargs=-1)
        self.fallback: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if self.multi else None  # typer's RuntimeParam.coerce, for a parameter of any type
        if self.kind is not None and not self.multi:
            if type(value) is self.kind:
                return value  # a str for a str, a default int for an int, ...: typer's adapter returns it as it is
            if self.kind is int and type(value) is str and _DECIMAL.fullmatch(value):
                return int(value)
        if self.fallback is None:
            from typer._coercion import build_runtime_param

            self.fallback = build_runtime_param(param.type_descriptor)
        return self.fallback.coerce(value, param=param, ctx=ctx)


def _coercer(param: Any) -> _Plain | None:
    desc: Any = getattr(param, "type_descriptor", None)
    info = getattr(desc, "parameter_info", None)
    if desc is None or info is None or not hasattr(param, "_runtime_param"):
        return None
    multi = bool(param.multiple or param.nargs == -1)
    plain = (
        desc.annotation in (str, int, float)
        and desc.file_annotation is None
        and getattr(info, "parser", None) is None
        and getattr(info, "click_type", None) is None
        and getattr(info, "min", None) is None
        and getattr(info, "max", None) is None
        and not getattr(info, "clamp", False)
    )
    return _Plain(desc.annotation if plain and param.nargs == 1 else None, multi)


def install() -> None:
    """Make typer's parameters (every command's, and the help options typer adds while parsing) take the coercer
    above on first use instead of building their adapter. Idempotent; left alone where typer has no
    `_TyperParameter.get_runtime_param`."""
    try:
        from typer.core import _TyperParameter
    except ImportError:  # pragma: no cover - another typer
        return
    original = getattr(_TyperParameter, "get_runtime_param", None)
    if original is None or getattr(original, "_gpuready", False):
        return

    def get_runtime_param(self: Any) -> Any:
        if getattr(self, "_runtime_param", None) is None:
            coercer = _coercer(self)
            if coercer is None:
                return original(self)
            self._runtime_param = coercer
        return self._runtime_param

    get_runtime_param._gpuready = True  # type: ignore[attr-defined]
    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign]
