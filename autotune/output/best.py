"""best.json: the winner of a search, as written to the output directory.

``best.json`` is the contract between ``autotune search`` and its consumers
(``autotune emit``, ``autotune.load_setup``, the user's own tools). Writes are
atomic: a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from autotune._version import __version__
from autotune.errors import AutotuneError, SetupError, UsageError
from autotune.files import atomic_write_text, read_json
from autotune.records import SHORTHAND_ONLY, Workload
from autotune.setup_checks import missing_knob
from autotune.train_setup import BEST_SCHEMA, TrainSetup

SCHEMA_VERSION = BEST_SCHEMA
#: The words of an unconfirmed winner's note whose speedup is the paired ratio of an interrupted confirmation's rounds.
PAIRED_SO_FAR = "its speedup over the defaults is their paired ratio in the rounds both ran"
#: Said of a winner that is the PyTorch defaults themselves (:attr:`Best.defaults_won`) where a speedup would stand.
DEFAULTS_KEPT = "the PyTorch defaults themselves: nothing measurably faster was found"
#: The words of the note that the speedup and the two medians beside it disagree (each median from runs of its own).
MEDIANS_APART_NOTE = "speedup is the median of the paired rounds' ratios"

_NUMBER = (int, float)
#: Every field of best.json and the JSON types it may hold (``None``: null allowed).
FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,),
    "setup": (dict,),
    "workload": (dict,),
    "samples_per_s": _NUMBER,
    "samples_per_s_spread": _NUMBER,
    "defaults_samples_per_s": (*_NUMBER, type(None)),
    "speedup": (*_NUMBER, type(None)),
    "speedup_rounds": (list,),
    "peak_memory_bytes": (int, type(None)),
    "effective_batch": (int,),
    "reference_batch": (int,),
    "lr": _NUMBER,
    "hardware": (dict,),
    "versions": (dict,),
    "command": (str,),
    "created": (str,),
    "notes": (list,),
    "world_size": (int,),
    "confirmed": (bool,),
    "study": (str,),
    "torch_threads": (int, type(None)),
}
#: The lowest value of each numeric field (a hand-edited ``"lr": -1`` reached train.py's defaults).
_LOWEST: dict[str, float] = {
    "samples_per_s": 0, "samples_per_s_spread": 0, "defaults_samples_per_s": 0, "speedup": 0, "lr": 0,
    "effective_batch": 1, "reference_batch": 1, "world_size": 1, "peak_memory_bytes": 0, "torch_threads": 1,
}
#: Fields whose lowest value is allowed (the others must be above it).
_AT_LEAST = ("samples_per_s_spread", "effective_batch", "reference_batch", "world_size", "peak_memory_bytes", "torch_threads")
#: The highest value of a field (a hand-edited ``"world_size": 100000`` wrote ``torchrun --nproc_per_node 100000``).
_HIGHEST: dict[str, int] = {"world_size": 1024}
#: The JSON types a workload field of each annotation may hold, and their words; a Python int is a JSON number too.
_WORKLOAD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "a whole number"), "int | None": ((int, type(None)), "a whole number or null"),
    "float": (_NUMBER, "a number"), "str": ((str,), "a string"), "str | None": ((str, type(None)), "a string or null"),
    "bool": ((bool,), "true or false"), "bool | None": ((bool, type(None)), "true, false or null"),
}
#: Fields that may be missing (they have defaults).
OPTIONAL = ("hardware", "versions", "command", "created", "notes", "world_size", "confirmed", "study", "speedup_rounds", "torch_threads")


def check_best_dict(data: Any) -> dict[str, Any]:
    """Check best.json's schema version, fields and types, in one place.

    Returns:
        ``data``, known to be safe for :meth:`Best.from_dict`.

    Raises:
        AutotuneError: The first problem, in one line.
    """
    if not isinstance(data, dict):
        raise AutotuneError(f"best.json must hold a JSON object, not a {_json_type(data)}")
    if "schema" not in data:  # another program's JSON object: "has schema None" read as a version mismatch
        raise AutotuneError("this JSON file is not a best.json of autotune (it has no 'schema' field); pass the "
                            "directory or best.json an `autotune search` wrote")
    if type(data.get("schema")) is not int or data["schema"] != SCHEMA_VERSION:  # 1.0 and true are no schema 1, as load_setup reads it
        raise AutotuneError(
            f"best.json has schema {data.get('schema')!r}; this autotune reads the integer schema {SCHEMA_VERSION} "
            "(rerun `autotune search`)"
        )
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise AutotuneError(f"best.json has unknown fields: {', '.join(map(str, unknown))[:200]} (a hand edit, or a best.json of a "
                            f"newer autotune than {__version__})")
    for name, types in FIELDS.items():
        if name not in data:
            if name in OPTIONAL:
                continue
            raise AutotuneError(f"best.json lacks the field {name!r}")
        value = data[name]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):  # True is an int, not a number
            given = repr(value) if isinstance(value, float) and int in types else _a(_json_type(value))  # 32.5 for a count
            raise AutotuneError(f"best.json field {name!r} must be {_expected(types)}, not {given}")
        if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN and Infinity: printed as "nan samples/s"
            raise AutotuneError(f"best.json field {name!r} must be a finite number, not {value}")
    for name, low in _LOWEST.items():
        value = data.get(name)
        if isinstance(value, (int, float)) and not (low <= value if name in _AT_LEAST else low < value):
            bound = f">= {low}" if name in _AT_LEAST else f"> {low}"
            raise AutotuneError(f"best.json field {name!r} must be {bound}, got {value!r}")
    for name, high in _HIGHEST.items():
        if isinstance(data.get(name), int) and data[name] > high:
            raise AutotuneError(f"best.json field {name!r} must be <= {high}, got {data[name]!r}: the processes on one machine")
    notes = data.get("notes", [])
    if not all(isinstance(n, str) for n in notes):
        raise AutotuneError("best.json field 'notes' must be a list of strings")
    ratios = data.get("speedup_rounds", [])
    if not all(isinstance(r, _NUMBER) and not isinstance(r, bool) and math.isfinite(r) and r > 0 for r in ratios):
        raise AutotuneError("best.json field 'speedup_rounds' must be a list of positive numbers")
    # A knob or the model left out would take its default: a setup that was not measured, under the measured speed.
    knob = missing_knob(data["setup"])
    missing = f"setup.{knob}" if knob is not None else ("workload.model" if "model" not in data["workload"] else None)
    if missing is not None:
        raise AutotuneError(f"best.json lacks the field '{missing}'")
    if stray := sorted(set(data["workload"]) - {f.name for f in fields(Workload)}):
        raise AutotuneError(f"best.json has unknown fields: {', '.join(f'workload.{k}' for k in map(str, stray))[:200]} (a hand "
                            f"edit, or a best.json of a newer autotune than {__version__})")
    for item in fields(Workload):  # by its annotation: "x" for a count failed later as '<' not supported, naming no field
        kinds, words = _WORKLOAD_TYPES.get(str(item.type), ((object,), ""))
        value = data["workload"].get(item.name)
        unread = item.name in SHORTHAND_ONLY and data["workload"].get("task") is not None  # earlier versions wrote null there
        if item.name in data["workload"] and not unread and ((isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds)):
            raise AutotuneError(f"best.json field 'workload.{item.name}' must be {words}, not {_a(_json_type(value))}")
    sys_path = data["workload"].get("sys_path", [])
    if not isinstance(sys_path, list) or not all(isinstance(p, str) for p in sys_path):
        raise AutotuneError("best.json field 'workload.sys_path' must be a list of strings")
    return data


def search_thread_env(best: Best) -> dict[str, str] | None:
    """The thread variables (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``) set where the search ran, which gave torch its own
    thread count in the trials: best.json's ``hardware.cpu.thread_env``, as the probe read it; a DDP search's ranks got
    ``OMP_NUM_THREADS=1`` where it was not set, as torchrun gives them. None where best.json does not say (an earlier
    version, a hand edit that is no mapping of names to strings)."""
    cpu = best.hardware.get("cpu") if isinstance(best.hardware, dict) else None
    said = cpu.get("thread_env") if isinstance(cpu, dict) else None
    if not isinstance(said, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in said.items()):
        return None
    return {**({"OMP_NUM_THREADS": "1"} if best.world_size > 1 else {}), **said}


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _a(word: str) -> str:
    return word if word == "null" else f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _expected(types: tuple[type, ...]) -> str:
    """What a field of ``types`` must be, in words: "a number or null"; "a whole number" where a float is no such value."""
    words = dict.fromkeys("null" if t is type(None) else "whole number" if t is int and float not in types else _json_type(t()) for t in types)
    return " or ".join(map(_a, words))


def scaled_lr(lr: float, effective: int, reference: int, rule: str = "sqrt") -> float:
    """The learning rate at ``effective`` batch, given ``lr`` at ``reference``.

    ``rule`` is ``"sqrt"`` for adaptive optimizers (Adam-family: their
    training dynamics hold when the rate grows with the square root of the
    batch, Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
    Gradient Algorithms") or ``"linear"`` for SGD-like ones (Goyal et al.
    2017), or ``"none"`` for optimizers whose step does not follow the gradient's scale (sign-based such as Lion and
    Rprop, orthogonalized such as Muon, parameter-free such as Prodigy): no batch rule holds for them, the rate is kept.
    autotune's own classifier trains with AdamW.
    """
    ratio = effective / reference
    return lr * (math.sqrt(ratio) if rule == "sqrt" else ratio if rule == "linear" else 1.0)


@dataclass(frozen=True)
class Best:
    """The winning setup of a search and the evidence for it.

    Attributes:
        setup: The winning TrainSetup.
        workload: What was trained (model, image size, data, device; a Task:
            its reference, and no image size in best.json).
        samples_per_s: The winner's confirmed median throughput (unconfirmed: its median in the rounds an
            interrupted confirmation measured, else its single trial's).
        samples_per_s_spread: Range (max - min) of those rounds (of its trial's windows).
        defaults_samples_per_s: PyTorch defaults, measured in the same rounds (or their single trial).
        speedup: Over the defaults: the median of the per-round ratios of the rounds both ran (confirmed, or
            those of an interrupted confirmation), else ``samples_per_s / defaults_samples_per_s``; None if
            unknown (:attr:`speedup_basis` says which).
        speedup_rounds: The paired rounds' ratios that :attr:`speedup` is the median of, in ascending order; empty
            where it rests on no paired round (or in a best.json written before the field).
        peak_memory_bytes: Peak memory of the winner's setup: the largest of
            its trials and its confirmation runs, so it can exceed the figure
            in the trial's own trials.csv row (a confirmation run measured
            beside held finalists gives none: :mod:`autotune.runner.held`).
        effective_batch: micro-batch x accumulation x world size.
        reference_batch: The effective batch the learning rate refers to.
        lr: The learning rate at ``reference_batch`` scaled to ``effective_batch``
            by the workload's rule (square root for Adam-family optimizers,
            linear for SGD-like ones), as the emitted script scales it.
        hardware: The probe summary (``probes`` JSON).
        versions: Software versions.
        command: The command line that produced the result.
        created: ISO-8601 time of writing.
        notes: Things the user must know (changed math, synthetic data, ...).
        world_size: Ranks the setup was measured with (run under torchrun when > 1).
        confirmed: Chosen by the interleaved confirmation rounds; False for the
            fastest single trial of an interrupted search (its notes say why).
        study: The name of the study the search kept its trials in (``autotune report`` and ``autotune status``
            tell this search's best.json from another study's in the same storage); empty in a best.json written
            before the field.
        torch_threads: Torch's own intra-op thread count in the winner's trials (``torch.get_num_threads()`` there,
            a DDP trial's first rank's) where its ``num_threads`` is ``None`` (auto): the count the emitted script's
            ``--threads auto`` was measured with, which it compares with its own. None where the setup pins a count,
            no trial of the setup recorded one, or best.json was written before the field.
    """

    setup: TrainSetup
    workload: Workload
    samples_per_s: float
    samples_per_s_spread: float
    defaults_samples_per_s: float | None
    speedup: float | None
    peak_memory_bytes: int | None
    effective_batch: int
    reference_batch: int
    lr: float
    hardware: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    created: str = ""
    notes: tuple[str, ...] = ()
    world_size: int = 1
    confirmed: bool = True
    study: str = ""
    speedup_rounds: tuple[float, ...] = ()
    torch_threads: int | None = None

    def lr_for(self, world_size: int = 1) -> float:
        """The learning rate for this setup trained by ``world_size`` processes (DDP ranks) instead of the search's
        :attr:`world_size`: the effective batch changes with them, and the rate follows it by the workload's rule
        (:func:`scaled_lr`, from the reference rate and batch). ``lr_for(best.world_size)`` is :attr:`lr`."""
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise UsageError(f"world_size must be a whole number >= 1, got {world_size!r}")
        return scaled_lr(self.workload.lr, self.setup.effective_batch(world_size), self.reference_batch, self.workload.lr_scaling)

    @property
    def defaults_won(self) -> bool:
        """Whether the confirmed winner is the PyTorch defaults themselves, kept as nothing measurably faster was found:
        their :attr:`speedup` of 1.0 against themselves rests on no paired round, and the summary lines state none."""
        return self.confirmed and self.speedup == 1.0 and not self.speedup_rounds

    @property
    def speedup_basis(self) -> str:
        """What :attr:`speedup` rests on, in words: the confirmation's paired rounds, those an interrupted one measured
        (its note says so), or two single trials."""
        ratios = self.speedup_rounds
        low, high = (f"{r:.2f}x" for r in (ratios[0], ratios[-1])) if ratios else ("", "")
        spread = ("" if len(ratios) < 2 else f"all {low}" if low == high else f"{low} to {high}")
        if self.confirmed:  # medians of runs of their own beside it: the line's three figures disagree, said in a note
            apart = any(MEDIANS_APART_NOTE in note for note in self.notes)
            rounds = f"median of {len(ratios)} paired rounds, {spread}" if spread else "one paired round" if ratios else "median of the paired rounds"
            return rounds + ("; the two medians were measured apart: see the note" if apart else "")
        if any(PAIRED_SO_FAR in note for note in self.notes):
            return "paired rounds of an interrupted confirmation" + (f" ({spread})" if spread else "") + ", unconfirmed"
        return "single trials, unconfirmed"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``schema`` first)."""
        data = asdict(self)
        data["setup"] = self.setup.to_dict()
        data["workload"] = self.workload.to_dict()
        data["notes"] = list(self.notes)
        data["speedup_rounds"] = list(self.speedup_rounds)
        return {"schema": SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Best:
        """Inverse of :meth:`to_dict`.

        Raises:
            AutotuneError: Missing or invalid fields.
        """
        data = dict(check_best_dict(data))
        data.pop("schema", None)
        try:
            data["setup"] = TrainSetup.from_dict(data["setup"])
            data["workload"] = Workload.from_dict(data["workload"])
            data["notes"] = tuple(data.get("notes", ()))
            data["speedup_rounds"] = tuple(float(r) for r in data.get("speedup_rounds", ()))
            if "confirmed" not in data:  # written before the field: its notes said so
                data["confirmed"] = not any(str(n).startswith("not confirmed") for n in data["notes"])
            best = cls(**data)
        except KeyError as exc:
            raise AutotuneError(f"best.json lacks the field {exc.args[0]!r}") from None
        except (TypeError, ValueError, SetupError, AutotuneError) as exc:
            raise AutotuneError(f"best.json is invalid: {exc}") from None
        made = best.setup.effective_batch(best.world_size)
        if made != best.effective_batch:  # a knob edited by hand: the figures, the lr and the header are another setup's
            setup = best.setup
            raise AutotuneError(
                f"best.json's setup makes an effective batch of {made} (batch_size {setup.batch_size} x accumulation_steps "
                f"{setup.accumulation_steps} x {best.world_size} process{'es' if best.world_size > 1 else ''}), its "
                f"effective_batch field {best.effective_batch}: the setup (or world_size) was edited after the search, so its measured figures and "
                f"its lr ({best.lr:g}) are another setup's: put the search's values back and pass train.py --batch-size and "
                "--accum-steps (it scales the lr for them), or rerun `autotune search` with --set for the knobs you changed")
        return best


def write_best(path: str | Path, best: Best) -> None:
    """Write ``best.json`` atomically."""
    atomic_write_text(path, json.dumps(best.to_dict(), indent=2) + "\n")


def read_best(path: str | Path) -> Best:
    """Read ``best.json`` (or the ``best.json`` of a directory) whole: ``setup``, ``lr`` (the learning rate scaled for
    the winner's effective batch, what the emitted ``train.py`` trains with), ``samples_per_s``, ``speedup``,
    ``workload``, ``hardware`` and the notes. Public as ``autotune.load_best``.

    Raises:
        AutotuneError: The file is missing, unreadable, not JSON or invalid.
    """
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise AutotuneError(f"load_best takes the path of a best.json, got {type(path).__name__}")
    if not os.fspath(path):  # Path("") is the working directory: its best.json was read, as load_setup("") refuses
        raise AutotuneError("load_best takes the path of a best.json, got an empty path")
    file = Path(path)
    if file.is_dir():
        file = file / "best.json"
    started = (file.parent / "study.db").exists()  # a search's directory before (or without) its winner
    data = read_json(file, AutotuneError, f" yet: a search running in {file.parent} writes it once it confirms a winner; one that "
                     "stopped before: rerun its command (its trials are kept); `autotune status` of that directory says which"
                     if started else " (run `autotune search` first)")
    try:
        return Best.from_dict(data)
    except AutotuneError as exc:
        raise AutotuneError(f"{file}: {exc}") from None


#: The public name of :func:`read_best` (``autotune.load_best``).
load_best = read_best
