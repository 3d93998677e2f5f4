"""Turning a ``--workload`` spec into a :class:`Workload`, with one-line errors.

Specs: a built-in name (``image``, ``text``, ``storage``), ``package.module:attr``, or
``path/to/file.py:attr``; the attr is a Workload, a DataLoader, ``(DataLoader, step)``, or a
function of no arguments returning one of them (a framework's own builds one:
``tuner.integrations.lightning.workload_from_lightning``, ``...huggingface.workload_from_trainer``).
A file is imported under its own module stem with its folder first on ``sys.path``: DataLoader
workers started with ``spawn`` copy the parent's ``sys.path`` and unpickle the dataset by module
name, so the name must be one they can import again.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from torch.utils.data import DataLoader

from objectives._workload import Workload
from objectives.image import image_workload
from objectives.storage import storage_workload
from objectives.text import text_workload

__all__ = ["BUILTIN_WORKLOADS", "WorkloadError", "load_workload"]

BUILTIN_WORKLOADS: dict[str, Callable[..., Workload]] = {
    "image": image_workload,
    "text": text_workload,
    "storage": storage_workload,
}


class WorkloadError(ValueError):
    """A workload spec or its options cannot give a Workload; the message is one line."""


def load_workload(spec: str, options: Mapping[str, Any] | None = None) -> Workload:
    """The workload named by ``spec``; ``options`` are keyword arguments of a built-in factory.

    String values for integer options are parsed, so ``key=value`` pairs from a command line
    can be passed as they are. A module or file spec is imported and run: it is code.

    Args:
        spec: a built-in name (``image``, ``text``, ``storage``), ``package.module:attr`` or
            ``path/to/file.py:attr``; the attribute is a :class:`Workload`, a DataLoader,
            ``(DataLoader, step)``, or a function of no arguments returning one of those.
        options: keyword arguments of the built-in workload's factory; None for none.

    Returns:
        The workload.

    Raises:
        WorkloadError: the spec names nothing loadable, or options are given for a
            non-built-in workload or are unknown to its factory (a one-line message).

    Example:
        >>> load_workload("storage", {"samples": "64"}).name
        'storage'
    """
    options = dict(options or {})
    if spec in BUILTIN_WORKLOADS:
        return _builtin(spec, options)
    module_part, colon, attr = spec.rpartition(":")
    if not colon or not module_part or not attr:
        raise WorkloadError(
            f"workload {spec!r} is not a built-in ({', '.join(BUILTIN_WORKLOADS)}), "
            "'package.module:attr' or 'path/to/file.py:attr'"
        )
    if options:
        raise WorkloadError(
            f"workload options ({', '.join(sorted(options))}) are only for the built-in "
            f"workloads; give {spec!r} its settings in its own code"
        )
    if module_part.endswith(".py"):
        module = _import_file(Path(module_part))
    else:
        module = _import_module(module_part)
    if not hasattr(module, attr):
        raise WorkloadError(f"module {module.__name__!r} has no attribute {attr!r} ({spec})")
    return _as_workload(getattr(module, attr), spec)


def _builtin(name: str, options: dict[str, Any]) -> Workload:
    factory = BUILTIN_WORKLOADS[name]
    parameters = inspect.signature(factory).parameters
    kwargs: dict[str, Any] = {}
    for option, value in options.items():
        if option not in parameters:
            raise WorkloadError(
                f"workload {name!r} has no option {option!r}; accepted: {', '.join(parameters)}"
            )
        kwargs[option] = _parse_option(name, option, value, parameters[option].default)
    try:
        return factory(**kwargs)
    except (ValueError, TypeError) as error:
        raise WorkloadError(f"workload {name!r}: {_one_line(error)}") from error


def _parse_option(workload: str, option: str, value: Any, default: Any) -> Any:
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise WorkloadError(
                f"option {option!r} of workload {workload!r} must be an integer, got {value!r}"
            ) from None
    return value


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise WorkloadError(f"no module named {name!r} (is it on sys.path?)") from error
        raise WorkloadError(f"importing {name!r} failed: {_describe(error)}") from error
    except Exception as error:
        raise WorkloadError(f"importing {name!r} failed: {_describe(error)}") from error


def _import_file(path: Path) -> ModuleType:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise WorkloadError(f"workload file {str(path)!r} does not exist")
    name = path.stem
    if not name.isidentifier():
        raise WorkloadError(
            f"workload file {path.name!r} is not importable as a module (rename it to a valid "
            "Python identifier, for DataLoader workers to import it)"
        )
    loaded = sys.modules.get(name)
    if loaded is not None and not _is_from(loaded, path):
        raise WorkloadError(
            f"workload file {str(path)!r} has the name of module {name!r}, already imported "
            f"from {getattr(loaded, '__file__', None) or 'a built-in'}; rename the file"
        )
    folder = str(path.parent)
    if not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
    module = _import_module(name)
    if not _is_from(module, path):
        raise WorkloadError(
            f"module name {name!r} of workload file {str(path)!r} resolves to "
            f"{getattr(module, '__file__', None) or 'a built-in'}; rename the file"
        )
    return module


def _is_from(module: ModuleType, path: Path) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve() == path


def _as_workload(value: Any, spec: str) -> Workload:
    """A Workload from what ``spec`` names: a Workload, a DataLoader, ``(DataLoader, step)``,
    or a function of no arguments returning one of those."""
    if _is_workload_like(value):
        return _from_value(value, spec)
    if not callable(value):
        raise WorkloadError(
            f"{spec} has type {type(value).__name__}; expected a Workload, a DataLoader, "
            "(DataLoader, step) or a function returning one"
        )
    try:
        inspect.signature(value).bind()
    except TypeError:
        raise WorkloadError(f"{spec} must be callable without arguments") from None
    except ValueError:  # no signature to inspect (some builtins): let the call decide
        pass
    try:
        result = value()
    except WorkloadError as error:  # already says what is wrong, in one line
        raise WorkloadError(f"{spec}: {_one_line(error)}") from error
    except Exception as error:
        raise WorkloadError(f"calling {spec} failed: {_describe(error)}") from error
    if not _is_workload_like(result):
        raise WorkloadError(
            f"{spec} returned a value of type {type(result).__name__}; expected a Workload, "
            "a DataLoader or (DataLoader, step) (Lightning: workload_from_lightning(datamodule, "
            "module), from tuner.integrations.lightning)"
        )
    return _from_value(result, spec)


def _is_workload_like(value: Any) -> bool:
    if isinstance(value, Workload | DataLoader):
        return True
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], DataLoader)


def _from_value(value: Workload | DataLoader | tuple[Any, Any], spec: str) -> Workload:
    if isinstance(value, Workload):
        return value
    loader, step = value if isinstance(value, tuple) else (value, None)
    if step is not None and not callable(step):
        raise WorkloadError(f"{spec}: the step beside the DataLoader is not callable")
    name = spec.rpartition(":")[2] or "dataloader"
    try:
        return Workload.from_dataloader(loader, step, name=name)
    except ValueError as error:
        raise WorkloadError(f"{spec}: {_one_line(error)}") from None


def _describe(error: BaseException) -> str:
    message = _one_line(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
