"""A user's object by its import path (`pkg.module:Name`: a model, a dataset, an optimizer, a method, a
callback) and an exception as one short line: what config/, core/, models/, methods/ and data/ share
when they name or import what the user wrote. No torch here."""

from __future__ import annotations

import importlib

from ecotrain.base.errors import DataError


def describe(exc: BaseException) -> str:
    """An exception as one short line: `ValueError: message` (user code's messages may span lines)."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def import_object(path: str, what: str):
    mod_name, sep, attr = path.partition(":")
    if not sep:
        raise DataError(f"{what}: '{path}' is not a built-in name nor an import path 'pkg.module:Name'")
    if not mod_name or not attr:
        raise DataError(f"{what}: '{path}' is not an import path 'pkg.module:Name'")
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        raise DataError(f"{what}: cannot import '{path}' ({exc})") from None
    except (Exception, SystemExit) as exc:  # the user's module itself failed while importing
        raise DataError(f"{what}: importing module '{mod_name}' (for '{path}') raised {describe(exc)}") from None
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise DataError(f"{what}: cannot import '{path}' (module '{mod_name}' has no attribute '{attr}')") from None
    except Exception as exc:  # a module-level __getattr__ that raises
        raise DataError(f"{what}: getting '{attr}' from module '{mod_name}' raised {describe(exc)}") from None
    return obj
