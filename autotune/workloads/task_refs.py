"""The ``package.module:function`` reference of a workload factory, from the text or the function the user gave.

The trial processes import the factory by that name: a reference they cannot import (a lambda, a nested function, a
method, a function of the script run as ``__main__``, a module loaded under another name) is refused here, in this
process, with what to pass instead.
"""

from __future__ import annotations

import importlib.util
import keyword
import sys
import unicodedata
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from autotune.errors import MalformedReference, WorkloadError
from autotune.workloads.models import is_factory_ref, torchvision_models, validate_model_ref

__all__ = ["task_ref"]


def _unimportable_part(ref: str) -> str:
    """Why a part of ``ref`` (``package.module:function``) is no name an import can take (a keyword: a folder named
    ``try``; a hyphen: ``my-exp``; a leading digit; spaces pasted along) and what to do; empty when each part is one."""
    module, _, function = ref.partition(":")
    if "(" in function:  # make(n=300): arguments, which a reference cannot carry
        return (f"{function!r} passes arguments, and the trial processes call the factory without any: write a function "
                f"without arguments that calls {function.partition('(')[0].strip()}(...) with them, and name it")
    if function.startswith(":"):
        return "the reference has two ':' in a row: one separates the module from the function"
    parts = module.split(".")
    for index, part in enumerate((*parts, function)):
        is_function = index == len(parts)
        if not part.strip():
            return ("no function is named after the ':'" if is_function else "no module is named before the ':'" if module.strip() == ""
                    else "a module's name between the dots is empty: remove the stray '.'")
        if part != part.strip():
            return f"{part!r} has spaces at its ends: remove them"
        if keyword.iskeyword(part):
            why = f"{part!r} is a Python keyword"
        elif part.isidentifier() and unicodedata.normalize("NFKC", part) != part:
            why = f"{part!r} changes under Unicode normalization (NFKC), as Python reads names"
        elif not part.isidentifier():
            why = f"{part!r} is not a Python name (letters, digits and _, not starting with a digit)"
        else:
            continue
        fix = ("name a function at the top level of the module" if is_function and "." in part else "rename the function" if is_function
               else "rename that folder, or put the folder that holds the module on PYTHONPATH and name the module alone"
               if index < len(parts) - 1 else "rename that file")
        return f"{why}: the trial processes import it by name, so {fix}"
    return ""


def task_ref(workload: str | Callable[..., Any]) -> str:
    """The ``package.module:function`` reference of a workload factory.

    Args:
        workload: The reference itself, or the factory function (it must be
            importable by the trial processes under that name).

    Raises:
        WorkloadError: Malformed text, or a callable the trial processes
            cannot import (a lambda, a nested function, a function defined
            in ``__main__``), with how to fix it.
    """
    if isinstance(workload, str):
        file, _, function = workload.partition(":")
        if file.endswith(".py"):  # a file name where a module name goes; none reaches an absolute one or one through ..
            path = PurePath(file[:-3])
            far = path.is_absolute() or ".." in path.parts
            named = f"from {path.parent} (or with it on PYTHONPATH) pass {path.name}" if far else ".".join(path.parts)
            raise MalformedReference(f"workload {workload!r}: name the module, not its file: {named}:{function}")
        if not is_factory_ref(workload):
            # Worded for both: the Python API's callers read "model takes it" (errors.in_python_terms).
            shorthand = (f"; {workload!r} is a torchvision model: --model takes it, to tune it on images (the classifier "
                         "shorthand)") if workload in torchvision_models() else ""
            raise MalformedReference(f"workload {workload!r} must be package.module:function (a factory returning autotune.Task){shorthand}")
        try:
            ref = validate_model_ref(workload)
        except WorkloadError:
            why = _unimportable_part(workload)
            raise MalformedReference(f"workload {workload!r} is not a valid reference; expected package.module:function" + (
                f" ({why})" if why else "")) from None
        if file == "__main__":  # found in this process, the user's script; a trial process's __main__ is autotune's own
            main = sys.modules.get("__main__")
            spec = getattr(getattr(main, "__spec__", None), "name", None)  # python -m mypkg.train: mypkg.train
            script = PurePath(str(getattr(main, "__file__", None) or ""))
            module = spec if spec and spec != "__main__" else script.stem if script.suffix == ".py" and script.stem.isidentifier() else None
            if module is None or module.partition(".")[0] == "autotune":  # the autotune command itself: no module of the user's
                raise WorkloadError(f"workload {workload!r}: __main__ names no module of yours here (the trial processes cannot "
                                    "import it); pass package.module:function, the module that defines it")
            raise WorkloadError(f"workload {workload!r}: __main__ is the script run, which the trial processes cannot import; "
                                f"name its module instead: '{module}:{function}', with the call to autotune under "
                                "if __name__ == \"__main__\":")
        return ref
    if type(workload).__name__ == "Task" and hasattr(workload, "build_model"):
        raise WorkloadError("workload is a built autotune.Task: every trial process builds its own, so pass the function "
                            "that returns it (a function at the top level of an importable module, or 'module:function')")
    if not callable(workload):
        raise WorkloadError(f"workload must be 'package.module:function' or a function, got {type(workload).__name__}")
    module = getattr(workload, "__module__", None)
    qualname = getattr(workload, "__qualname__", "") or ""
    name = getattr(workload, "__name__", type(workload).__name__)
    fix = "define it at the top level of an importable module (a .py file) and pass it, or pass 'module:function'"
    if not isinstance(getattr(workload, "__qualname__", None), str):  # a functools.partial, a callable object: no name to import
        raise WorkloadError(f"workload {type(workload).__name__} object: the trial processes import the workload by its name, "
                            f"so it must be a function (not a functools.partial or a callable object); {fix}")
    if name == "<lambda>" or "<locals>" in qualname or "." in qualname or not module:
        kind = ("a lambda" if name == "<lambda>" else "a nested function" if "<locals>" in qualname
                else "a method or an attribute of a class" if "." in qualname else "a function of no module")
        owner = sys.modules.get(module) if module and module != "__main__" else None
        held = [key for key, value in vars(owner).items() if value is workload] if owner is not None else []
        known = f"; it is bound to {module}.{held[0]}: pass '{module}:{held[0]}', or {fix}" if held else f"; {fix}"
        raise WorkloadError(f"workload {name} is {kind}, which the trial processes cannot import by its own name{known}")
    if module == "__main__":
        raise WorkloadError(f"workload {name} is defined in __main__, which the trial processes cannot import; {fix}")
    loaded = sys.modules.get(module)
    origin = str(getattr(getattr(loaded, "__spec__", None), "origin", None) or "")
    path, last = PurePath(origin), module.rpartition(".")[2]
    named_so = path.stem == last or (path.stem == "__init__" and path.parent.name == last)  # a module, or a package
    if (loaded is None and not _findable(module)) or (origin.endswith(".py") and not named_so):
        where = f" from {origin}" if origin else ""
        how = " (importlib.util.spec_from_file_location?)" if origin.endswith(".py") else " (made by exec()?)"
        raise WorkloadError(f"workload {name}: its module {module!r} was loaded{where} under a name the trial processes "
                            f"cannot import{how}; {fix}")
    return validate_model_ref(f"{module}:{qualname}")


def _findable(module: str) -> bool:
    """Whether ``module`` can be imported by its name (a function's module run by runpy is not in sys.modules)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
