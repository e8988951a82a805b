"""Model references: torchvision names and user factories.

A model reference is either a torchvision classification model name
(``resnet50``) or a user factory ``package.module:function``. Both are
validated as text before anything is imported, so the same check guards the
trial runner and the code emitter.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import keyword
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import USER_CODE_ERRORS, MalformedReference, WorkloadError
from autotune.workloads.loader_args import LOADER_ARGUMENTS
from autotune.workloads.modes import has_batch_norm

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from autotune.records import Workload

def _is_identifier(part: str) -> bool:
    """A Python identifier (``tab_ünï`` too) that is no keyword and reads the same after NFKC normalization, as Python
    reads names in source (the emitted script's import then names the module that was searched)."""
    return part.isidentifier() and not keyword.iskeyword(part) and unicodedata.normalize("NFKC", part) == part


def is_factory_ref(ref: str) -> bool:
    """Whether ``ref`` names a user factory (``module:function``)."""
    return ":" in ref


def validate_model_ref(ref: str) -> str:
    """Check that ``ref`` is a safe model reference, without importing anything.

    Args:
        ref: ``"resnet50"`` or ``"package.module:function"``.

    Returns:
        The reference, unchanged.

    Raises:
        MalformedReference: The text is not an identifier, or not
            ``dotted.module:function`` made of identifiers (a usage error, exit 2).
    """
    if not isinstance(ref, str) or not ref:
        raise MalformedReference("model must be a torchvision model name or package.module:function")
    if is_factory_ref(ref):
        module, _, func = ref.partition(":")
        parts = module.split(".")
        if not module or not all(_is_identifier(p) for p in parts) or not _is_identifier(func):
            raise MalformedReference(
                f"model {ref!r} is not a valid factory reference; expected package.module:function"
            )
        return ref
    if not _is_identifier(ref):
        plain = ref.strip().removeprefix("torchvision.models.")  # a space pasted along, the module path of the name
        hint = f"; did you mean {plain}?" if plain != ref and _is_identifier(plain) else ""
        raise MalformedReference(f"model {ref!r} is not a valid model name{hint}")
    return ref


def torchvision_models() -> list[str]:
    """Names of torchvision's image classification models."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


#: torchvision's model families other than image classification, by module.
OTHER_KINDS = {
    "segmentation": "segmentation",
    "detection": "detection",
    "video": "video",
    "optical_flow": "optical-flow",
    "quantization": "quantized",
}


def other_torchvision_kind(ref: str) -> str | None:
    """The family of a torchvision model that is not an image classifier (``"detection"``, ...); None otherwise."""
    import torchvision

    for module, kind in OTHER_KINDS.items():
        family = getattr(torchvision.models, module, None)
        if family is not None and ref in torchvision.models.list_models(module=family):
            return kind
    return None


def check_model_name(ref: str) -> None:
    """Raise a helpful error for an unknown torchvision name (factories pass).

    Raises:
        WorkloadError: Unknown name, with the closest matches suggested.
    """
    if not is_factory_ref(ref) and "-" in ref:  # resnet-18, ViT-B-16 as papers write them: not an identifier, but meant
        squeezed = _same_but_separators(ref, torchvision_models())
        if squeezed:
            raise WorkloadError(f"unknown model {ref!r}; did you mean {squeezed[0]}?")
    validate_model_ref(ref)
    if is_factory_ref(ref):
        return
    names = torchvision_models()
    if ref not in names:
        kind = other_torchvision_kind(ref)
        if kind == "quantized":
            float_name = ref.removeprefix("quantized_")
            raise WorkloadError(f"{ref} is a torchvision quantized model, for inference only; tune its float version ({float_name})")
        if kind is not None:
            raise WorkloadError(
                f"{ref} is a torchvision {kind} model; --model tunes image classifiers: describe its training "
                "(dataset, loss) as an autotune.Task and pass --workload module:factory (docs/workloads.md)"
            )
        family = sorted((n for n in names if n.startswith(f"{ref.lower()}_")), key=_natural)[:3]  # vit: vit_b_16 first
        squeezed = _same_but_separators(ref, names)  # mobilenetv3small
        close = [ref.lower()] if ref.lower() in names else squeezed or family or difflib.get_close_matches(ref, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see torchvision.models.list_models()"
        raise WorkloadError(f"unknown model {ref!r}{hint}")


def _same_but_separators(ref: str, names: list[str]) -> list[str]:
    """The names that read as ``ref`` in any case, without its hyphens and underscores (``ViT-B-16``: vit_b_16)."""
    key = ref.strip().lower().replace("-", "").replace("_", "")
    return [n for n in names if n.replace("_", "") == key]


def _natural(name: str) -> list[Any]:
    """``name`` split into text and numbers, so efficientnet_b2 sorts before efficientnet_b10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class StartsAutotune(WorkloadError):
    """A factory's module that calls autotune at import (a search at the top level of the user's script)."""


def _users_copy(module_name: str, sys_path: Sequence[str]) -> str | None:
    """The file of ``module_name``'s top-level module or package in one of ``sys_path`` (the user's directories)."""
    top = module_name.partition(".")[0]
    for entry in sys_path:
        for candidate in (os.path.join(entry, top + ".py"), os.path.join(entry, top, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def _stdlib_twin(module_name: str) -> str | None:
    """Where the standard library holds a module of the same top-level name (``test``, ``code``, ``tokenize``): imports
    find it before the user's directories, which every trial process puts last on ``sys.path``."""
    import importlib.machinery
    import sysconfig

    top = module_name.partition(".")[0]
    if top in sys.builtin_module_names:
        return "built in"
    stdlib = sysconfig.get_paths()["stdlib"]
    spec = importlib.machinery.PathFinder.find_spec(top, [stdlib, os.path.join(stdlib, "lib-dynload")])
    return None if spec is None else spec.origin or stdlib


def _not_the_users(module_name: str, sys_path: Sequence[str], what: str, ref: str) -> str | None:
    """Why the module imported for ``module_name`` is not the user's file of that name, if it is not (another of that
    name, installed, comes first on ``sys.path``)."""
    mine = _users_copy(module_name, sys_path)
    loaded = getattr(sys.modules.get(module_name.partition(".")[0]), "__file__", None)
    if mine is None or not loaded or os.path.realpath(loaded) == os.path.realpath(mine):
        return None
    return (f"{module_name!r} for {what} {ref!r} imported {loaded}, not your {mine}: an installed module of that name comes "
            f"first on sys.path; rename yours")


#: Modules :func:`load_factory` is importing now (one asked for again while its import runs calls autotune at import).
_importing: set[str] = set()


def load_factory(ref: str, sys_path: Sequence[str], what: str = "model") -> Callable[..., Any]:
    """Import ``package.module:function`` (``sys_path`` entries first) and return the function.

    Args:
        ref: The factory reference (already validated).
        sys_path: Import paths put in front of ``sys.path`` (the caller's cwd).
        what: What the factory builds, for the error message.

    Raises:
        WorkloadError: The module cannot be imported (or fails while
            importing), or has no such callable.
    """
    module_name, _, func_name = ref.partition(":")
    # Appended, not put first: a json.py in the user's directory must not
    # shadow the standard library for the rest of the process.
    for entry in sys_path:
        if entry not in sys.path:
            sys.path.append(entry)
    mine = _users_copy(module_name, sys_path)
    twin = _stdlib_twin(module_name) if mine else None
    if twin is not None:  # this process may import the user's file (its directory first), the trials would not
        raise WorkloadError(f"{mine} for {what} {ref!r} has the name of a module of Python's "
                            f"standard library ({twin}), which imports find first; rename it")
    if module_name in _importing:  # its top level, run by the import below, asked for it again: it starts autotune itself
        raise StartsAutotune(
            f"importing {module_name!r} for {what} {ref!r} starts autotune again: its top level calls autotune.search() or "
            "autotune.trial(), and every trial process imports it; put that call under if __name__ == \"__main__\":"
        )
    _importing.add(module_name)
    try:
        module = importlib.import_module(module_name)
    except StartsAutotune:  # said once, by the inner call, not wrapped in this import's words
        raise
    except ModuleNotFoundError as exc:
        raise WorkloadError(f"cannot import {module_name!r} for {what} {ref!r}: {exc}") from None
    except USER_CODE_ERRORS as exc:  # the user's module raised while importing
        # A script's top level that parses sys.argv (argparse) or calls sys.exit: it runs again in every trial process.
        exits = "; its top level exits when imported: put the script's own code under if __name__ == \"__main__\":"
        raise WorkloadError(f"importing {module_name!r} for {what} {ref!r} failed: {type(exc).__name__}: {exc}"
                            f"{exits if isinstance(exc, SystemExit) else ''}") from None
    finally:
        _importing.discard(module_name)
    func = getattr(module, func_name, None)
    if func is None:  # a typo: the module's functions of close names
        close = difflib.get_close_matches(func_name, [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")], n=3)
        raise WorkloadError(_not_the_users(module_name, sys_path, what, ref) or f"{module_name!r} has no function {func_name!r} for {what} "
                            f"{ref!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
    if not callable(func):  # TASK = autotune.Task(...) at the module's top level, named instead of its factory
        raise WorkloadError(
            f"{func_name!r} in {module_name!r} is an object of type {type(func).__name__}, not a function, for {what} {ref!r}: "
            f"name a function that returns it (def make_{what}(): return {func_name})"
        )
    return func


def arguments_hint(func: Callable[..., Any], exc: BaseException) -> str:
    """What to do when a workload factory that needs arguments was called without them, or passed autotune.Task one it
    does not take ("" for any other failure)."""
    try:
        needed = [p.name for p in inspect.signature(func).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return ""
    if isinstance(exc, TypeError) and "Task.__init__() got an unexpected keyword argument" in str(exc):  # Task(sampler=...)
        return ("; autotune.Task takes model, dataset and loss, step, collate_fn, optimizer, batch_size, lr, batch_size_of "
                "(docs/workloads.md)" + next((why for name, why in LOADER_ARGUMENTS if f"'{name}'" in str(exc)), ""))
    if isinstance(exc, TypeError) and str(exc).startswith("Task.__init__() takes 3 positional arguments"):  # Task(m, d, loss)
        return "; autotune.Task takes model and dataset by position, the rest by keyword (loss=..., batch_size=..., lr=...)"
    if not needed or not isinstance(exc, TypeError) or "required" not in str(exc):
        return ""
    one = len(needed) == 1
    return (f"; a workload factory is called with no arguments ({', '.join(needed)} {'has' if one else 'have'} no default): give "
            f"{'it a default' if one else 'them defaults'}, or write a factory without arguments that calls it with {'its' if one else 'their'} "
            "values")


def check_factory(ref: str, sys_path: Sequence[str] = ()) -> None:
    """Import a user factory and check it is callable (does not call it)."""
    validate_model_ref(ref)
    if is_factory_ref(ref):
        load_factory(ref, sys_path)


def named_batch_norm(ref: str, *, num_classes: int, image_size: int) -> bool | None:
    """:func:`has_batch_norm` of a torchvision model by name, built on the meta device (no memory, milliseconds); None
    for a factory (not called in the parent) or a model that cannot be built there."""
    import torch

    if is_factory_ref(ref):
        return None
    try:
        with torch.device("meta"):
            return has_batch_norm(build_model(ref, num_classes=num_classes, image_size=image_size))
    except Exception:  # a builder that computes on tensors (regnet_y_128gf) fails there: then not known
        return None


def build_model(ref: str, *, num_classes: int, image_size: int, sys_path: Sequence[str] = ()) -> torch.nn.Module:
    """Instantiate the model, randomly initialised, for ``num_classes`` classes.

    A user factory is called with ``num_classes=`` when it accepts that
    argument (and ``image_size=`` likewise), otherwise with no arguments.

    Raises:
        WorkloadError: Unknown name, import failure, or a factory that does not
            return an ``nn.Module``.
    """
    import torch

    check_model_name(ref)
    if is_factory_ref(ref):
        func = load_factory(ref, sys_path)
        try:
            params: Mapping[str, inspect.Parameter] = inspect.signature(func).parameters
        except (TypeError, ValueError):
            params = {}
        kwargs: dict[str, int] = {}
        if "num_classes" in params:
            kwargs["num_classes"] = num_classes
        if "image_size" in params:
            kwargs["image_size"] = image_size
        model = func(**kwargs)
        if not isinstance(model, torch.nn.Module):
            task = " (an autotune.Task is given with --workload, not --model)" if type(model).__name__ == "Task" else ""
            raise WorkloadError(f"factory {ref} returned {type(model).__name__}, not a torch.nn.Module{task}")
        return model
    import torchvision

    options: dict[str, int | bool | None] = {"weights": None, "num_classes": num_classes}
    if ref.startswith("vit_"):
        options["image_size"] = image_size
    if ref in ("googlenet", "inception_v3"):  # their default initialisation, said without torchvision's FutureWarning
        options["init_weights"] = True
    return torchvision.models.get_model(ref, **options)


#: The smallest --image-size a torchvision classifier trains at, where the default 224 is too small: Inception v3's
#: auxiliary head fails below 299 px in training mode (298 fails, 299 trains).
SMALLEST_SIZE = {"inception_v3": 299}


def default_image_size(ref: str) -> int:
    """The shorthand's --image-size when none is given: 224, or more where the model cannot train at 224."""
    return max(224, SMALLEST_SIZE.get(ref, 0))


def built_size(ref: str) -> int | None:
    """The image size a torchvision classifier is built and trained for (the crop of its published weights' transforms:
    299 for inception_v3, 600 for efficientnet_b7); None for a factory, or where torchvision does not say."""
    if is_factory_ref(ref):
        return None
    try:
        from torchvision.models import get_model_weights

        crop = getattr(get_model_weights(ref).DEFAULT.transforms, "keywords", {}).get("crop_size")
    except Exception:  # an unknown name, a torchvision without weights metadata for it
        return None
    return int(crop[0] if isinstance(crop, (list, tuple)) else crop) if crop else None


def size_hint(workload: Workload, error: str | None, *, named_only: bool = False) -> str:
    """What the classifier's failure may depend on: the class count, the image size (a shape error
    often does), a hint when the input is too small (pooling leaves nothing) or off the model's 224 px;
    ``named_only``: only where the error names one of those (not the bare image size)."""
    if workload.task is not None:
        return ""
    text, size = error or "", workload.image_size
    if "Target" in text and "out of bounds" in text:
        return (f" (the data has {workload.num_classes} classes: the model must output as many; "
                "a factory that takes num_classes= is given it)")
    built = built_size(workload.model) or 224
    if "Output size is too small" in text or "Kernel size can't be greater than actual input size" in text:
        larger = f": it is built for {built} px, try --image-size {built}" if built > size else ""
        return f" (at --image-size {size}; the model needs larger images{larger})"
    if "indivisible by patch size" in text:  # torchvision's ViTs name their patch size last: vit_h_14
        patch = f" of {found[1]} px" if (found := re.fullmatch(r"vit_[a-z]_(\d+)", workload.model or "")) else ""
        return f" (at --image-size {size}; the model cuts images into patches{patch}: pass an --image-size its patch size divides, as {built} is)"
    if size != built and ("shape" in text or "size of tensor" in text):
        return f" (at --image-size {size}; the model may be built for {built} px: try --image-size {built})"
    return "" if named_only else f" (at --image-size {size})"


#: Weight of each auxiliary classifier's loss, by how many a model has: Inception v3
#: trains its one with 0.4, GoogLeNet its two with 0.3 each (as their papers do).
AUX_WEIGHTS = {1: 0.4, 2: 0.3}


def classification_loss(output: Any, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a classifier's output against the labels.

    The output is the logits, or an object holding them as ``.logits``:
    torchvision's Inception v3 and GoogLeNet return their auxiliary
    classifiers' logits too in training mode (``InceptionOutputs``,
    ``GoogLeNetOutputs``), whose losses are added with :data:`AUX_WEIGHTS`;
    a model returning a ``ModelOutput`` with ``.logits`` is read the same way.

    Raises:
        WorkloadError: The output holds no logits tensor.
    """
    import torch
    from torch.nn.functional import cross_entropy

    if isinstance(output, torch.Tensor):
        return cross_entropy(output, labels)
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise WorkloadError(
            f"the model returned {type(output).__name__}, not a logits tensor (nor an object with .logits); "
            "wrap it to return logits, or describe its loss with --workload (autotune.Task)"
        )
    fields = output._asdict() if hasattr(output, "_asdict") else {}
    aux = [value for name, value in fields.items() if name.startswith("aux") and isinstance(value, torch.Tensor)]
    loss = cross_entropy(logits, labels)
    for value in aux:
        loss = loss + AUX_WEIGHTS.get(len(aux), 0.3) * cross_entropy(value, labels)
    return loss
