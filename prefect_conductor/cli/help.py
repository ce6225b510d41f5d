"""Help screens that read like a standard typer/click CLI: ``conductor run [OPTIONS] QUESTION``.

Typer 0.29 draws two things its own way and has no setting for either (``typer/core.py``):

- a required argument shows in the usage line as ``{question}``
  (``TyperArgument._usage_display_name``);
- every parameter shows its Python type as a tag: ``<str>``, ``<int>``, ``<path>``, and
  ``<bool>`` even on flags, which take no value (``_TyperParameter.display_type``). A
  ``metavar`` replaces the tag on an option, but not on an argument, nor on ``--help``,
  which typer adds itself.

Typer builds the parameter objects itself (there is no ``cls=`` for a parameter), so the
command and group classes below, passed as ``cls=``, give their parameters click's display:
``QUESTION`` (``[NAME]`` when optional) in the usage line and in errors, no type on a flag,
click's type names (``TEXT``, ``INTEGER``, ``PATH``) or the option's ``metavar`` elsewhere.
Parsing and conversion stay typer's: only the display methods differ.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["ConductorCommand", "ConductorGroup"]

# typer's labels (without the angle brackets) -> click's ParamType names.
_CLICK_TYPE_NAMES = {
    "str": "TEXT",
    "int": "INTEGER",
    "float": "FLOAT",
    "bool": "BOOLEAN",
    "datetime": "DATETIME",
    "path": "PATH",
    "file": "FILE",
    "dir": "DIRECTORY",
}


def _click_type_name(param: TyperArgument | TyperOption, ctx: typer.Context) -> str:
    """``<int>`` -> ``INTEGER``; a choice (``fallback|error``) keeps its values as typed."""
    label = param.display_type(ctx).removeprefix("<").removesuffix(">")
    return _CLICK_TYPE_NAMES.get(label, label)


class _Argument(TyperArgument):
    def _metavar(self) -> str:
        return self.metavar or (self.name or "").upper()

    def _usage_display_name(self) -> str:
        name = self._metavar()
        if not self.required:
            name = f"[{name}]"
        return f"{name}..." if self.nargs != 1 else name

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        return _click_type_name(self, ctx)

    def get_error_hint(self) -> str:
        return f"'{self._metavar()}'"  # "Missing argument 'QUESTION'.", as in the usage line


class _Option(TyperOption):
    def display_type_rich(self, ctx: typer.Context) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        name = _click_type_name(self, ctx)
        return f"{name}..." if self.nargs != 1 else name


def _restyle(params: list[Any]) -> None:
    """Give typer's parameter objects click's display (a subclass adding methods, no state)."""
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _Argument
        elif type(param) is TyperOption:
            param.__class__ = _Option


class _ClickStyleHelp:
    """Restyles a typer command's or group's parameters, its help option included."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _restyle(self.params)

    def get_help_option(self, ctx: typer.Context) -> TyperOption | None:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        _restyle([option])
        return option


class ConductorCommand(_ClickStyleHelp, TyperCommand):
    """A typer command whose help reads like click's (see the module docstring)."""


class ConductorGroup(_ClickStyleHelp, TyperGroup):
    """A typer group whose help reads like click's (see the module docstring)."""
