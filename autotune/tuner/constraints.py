"""The user's ``--set``: parsing, merging, and narrowing a knob's values.

``--set KNOB=V`` pins a knob, ``KNOB=A,B`` offers choices, ``KNOB=LO..HI``
bounds an integer knob. The space (:mod:`autotune.tuner.space`) applies
the result to the values the probe and calibration allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.devices import DeviceInfo
from autotune.epochs import queue_fits
from autotune.errors import SetupError, UsageError
from autotune.flag_terms import in_flag_terms
from autotune.setup_checks import INT_LIMITS
from autotune.torch_knobs import COMPILE_MODES, DECODES, OPTIMIZER_IMPLS
from autotune.train_setup import AMP_MODES, KNOBS, TrainSetup
from autotune.units import plain_int

BOOL_KNOBS = ("pin_memory", "persistent_workers", "channels_last", "cudnn_benchmark", "tf32", "gradient_as_bucket_view", "static_graph")
INT_KNOBS = ("num_workers", "prefetch_factor", "batch_size", "accumulation_steps", "num_threads", "bucket_cap_mb")
#: The short names ``--set`` takes for four knobs (those of ``autotune trial``'s flags).
KNOB_ALIASES = {"workers": "num_workers", "prefetch": "prefetch_factor", "batch": "batch_size", "accum": "accumulation_steps"}
#: Knobs searched as integer ranges (every value between the bounds).
RANGE_KNOBS = ("num_workers", "prefetch_factor", "num_threads")
#: Knobs with named values.
CHOICE_KNOBS: dict[str, tuple[str, ...]] = {"compile": COMPILE_MODES, "optimizer_impl": OPTIMIZER_IMPLS, "decode": DECODES}
#: Knobs a device may refuse (checked against the device when pinned or offered).
DEVICE_KNOBS = ("amp", "pin_memory", "cudnn_benchmark", "tf32", "compile", "optimizer_impl", "decode")


@dataclass(frozen=True)
class Constraint:
    """What the user said about one knob with ``--set``.

    Exactly one of ``value`` (pin), ``choices`` or ``low``/``high`` (bounds).
    """

    knob: str
    value: Any = None
    choices: tuple[Any, ...] | None = None
    low: int | None = None
    high: int | None = None

    def __str__(self) -> str:
        """As ``--set`` writes it: ``num_workers=0``, ``amp=off,bf16``, ``num_workers=1..4``."""
        if self.choices is not None:
            return f"{self.knob}={','.join(map(shown, self.choices))}"
        if self.low is not None or self.high is not None:
            return f"{self.knob}={'' if self.low is None else self.low}..{'' if self.high is None else self.high}"
        return f"{self.knob}={shown(self.value)}"

    def allows(self, candidate: Any) -> bool:
        """Whether ``candidate`` satisfies the constraint."""
        if self.choices is not None:
            return candidate in self.choices
        if self.low is not None or self.high is not None:
            if not isinstance(candidate, int) or isinstance(candidate, bool):
                return False
            return (self.low is None or candidate >= self.low) and (self.high is None or candidate <= self.high)
        return candidate == self.value


def shown(value: Any) -> str:
    """A knob value as ``--set`` writes it (``None``: torch's own choice, ``auto``; booleans in lower case)."""
    if value is None:
        return "auto"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_value(knob: str, text: str) -> Any:
    text = text.strip()
    if knob in BOOL_KNOBS:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"--set {knob}: expected true or false, got {text!r}")
    if knob == "amp":
        lowered = text.lower()
        aliases = {"fp32": "off", "none": "off", "false": "off"}
        lowered = aliases.get(lowered, lowered)
        if lowered not in AMP_MODES:
            raise UsageError(f"--set amp: expected one of off, bf16, fp16, got {text!r}")
        return lowered
    if knob in ("num_threads", "optimizer_impl") and text.lower() in ("auto", "none"):
        return None  # torch's own choice (as the space: line shows it): no torch.set_num_threads call, no foreach/fused argument
    if knob in CHOICE_KNOBS:
        lowered = text.lower().replace("_", "-")
        if lowered not in CHOICE_KNOBS[knob]:
            auto = ", auto" if knob == "optimizer_impl" else ""
            raise UsageError(f"--set {knob}: expected one of {', '.join(CHOICE_KNOBS[knob])}{auto}, got {text!r}")
        return lowered
    value = plain_int(text)
    if value is None:
        expected = "an integer or auto" if knob == "num_threads" else "an integer"
        raise UsageError(f"--set {knob}: expected {expected}, got {text!r}")
    minimum = 0 if knob == "num_workers" else 1
    if value < minimum:
        raise UsageError(f"--set {knob}: must be >= {minimum}, got {value}")
    if value > INT_LIMITS[knob]:
        raise UsageError(f"--set {knob}: must be <= {INT_LIMITS[knob]}, got {text[:30]}")
    return value


def parse_constraint(text: str) -> Constraint:
    """Parse one ``--set`` argument.

    Forms: ``knob=value`` (pin), ``knob=a,b,c`` (choices; ``a|b|c`` as the search's ``space:`` line prints them), ``knob=lo..hi``
    (integer bounds, either side may be empty, not both).

    Raises:
        UsageError: Unknown knob or malformed value.
    """
    knob, sep, rest = text.partition("=")
    rest = rest.replace("|", ",")  # choices as the search's space: line prints them (batch_size=8|16|32)
    knob = knob.strip().lower().replace("-", "_")
    knob = KNOB_ALIASES.get(knob, knob)
    if not sep or not rest.strip():
        raise UsageError(f"--set {text!r}: expected KNOB=VALUE, KNOB=A,B,C or KNOB=LO..HI")
    if knob not in KNOBS:
        short = ", ".join(f"{alias} ({name})" for alias, name in KNOB_ALIASES.items())
        raise UsageError(f"--set {text!r}: unknown knob {knob!r}; knobs: {', '.join(KNOBS)}; short names: {short}")
    if ".." in rest:
        if knob not in INT_KNOBS:
            raise UsageError(f"--set {text!r}: ranges work for integer knobs only ({', '.join(INT_KNOBS)})")
        low_text, _, high_text = rest.partition("..")
        if "," in rest or "." in low_text + high_text:
            raise UsageError(f"--set {text!r}: a range is LO..HI (either side may be empty), a list of choices A,B,C: not both")
        low = _parse_value(knob, low_text) if low_text.strip() else None
        high = _parse_value(knob, high_text) if high_text.strip() else None
        if (low_text.strip() and low is None) or (high_text.strip() and high is None):
            raise UsageError(f"--set {text!r}: a range bounds thread counts; offer torch's own choice as a choice (num_threads=auto,1,2)")
        if low is None and high is None:  # would read as a pin to None (torch's own thread count, or no value at all)
            raise UsageError(f"--set {text!r}: a range needs a bound, LO.. or ..HI (leave the knob out to search all its values)")
        if low is not None and high is not None and low > high:
            raise UsageError(f"--set {text!r}: empty range")
        return Constraint(knob, low=low, high=high)
    if "," in rest:
        parts = rest.split(",")
        if not any(part.strip() for part in parts):
            raise UsageError(f"--set {text!r}: no values")
        if any(not part.strip() for part in parts):  # 1,,2 or 2,8, : a value left out by a typo
            raise UsageError(f"--set {text!r}: an empty value in the list of choices A,B,C")
        return Constraint(knob, choices=tuple(dict.fromkeys(_parse_value(knob, part) for part in parts)))
    return Constraint(knob, value=_parse_value(knob, rest))


def parse_constraints(items: object) -> tuple[Constraint, ...]:
    """Parse the ``--set`` arguments the Python API was given (``constraints=``): a list of them, or one.

    Raises:
        UsageError: ``items`` is not a string or a sequence of strings (None, a number), or one is malformed.
    """
    texts = [items] if isinstance(items, str) else items
    if not isinstance(texts, Sequence) or not all(isinstance(text, str) for text in texts):
        wrong = [f"{text!r} in it" for text in texts if not isinstance(text, str)] if isinstance(texts, Sequence) else []
        raise UsageError(f"--set must be a list of strings such as 'amp=bf16', got {(wrong or [repr(items)])[0]}")
    return tuple(parse_constraint(text) for text in texts)


def pinned_values(texts: Iterable[str]) -> dict[str, Any]:
    """``KNOB=VALUE`` pins as TrainSetup keyword arguments (``autotune trial --set``).

    Raises:
        UsageError: Malformed, unknown, a range or a list of choices.
    """
    pins: dict[str, Any] = {}
    for constraint in merge_constraints(parse_constraint(text) for text in texts).values():
        if constraint.choices is not None or constraint.low is not None or constraint.high is not None:
            raise UsageError(f"--set {constraint.knob}: a trial runs one setup; give one value")
        pins[constraint.knob] = constraint.value
    return pins


def merge_constraints(items: Iterable[Constraint]) -> dict[str, Constraint]:
    """Index constraints by knob; a knob given twice is an error."""
    merged: dict[str, Constraint] = {}
    for item in items:
        if item.knob in merged:
            raise UsageError(f"--set {item.knob} given twice")
        merged[item.knob] = item
    return merged


def apply_constraints(
    base: dict[str, tuple[Any, ...]], constraints: dict[str, Constraint], why: dict[str, str] | None = None,
    top: dict[str, int] | None = None,
) -> dict[str, tuple[Any, ...]]:
    """Narrow each knob's candidates by the user's constraints.

    A pinned value is taken as given, even outside the computed candidates;
    whether the hardware offers it (amp=bf16 on a CPU without bf16, say) is
    :func:`check_constraints`' refusal, made before the search starts.
    ``why`` says, by knob, why its candidates end where they do (the refusal adds it); ``top`` gives, by knob, the
    largest value a bound may keep where its candidates (powers of two) stop below it.

    Raises:
        UsageError: A constraint that leaves no candidate.
    """
    values = dict(base)
    for knob, constraint in constraints.items():
        if constraint.choices is None and constraint.low is None and constraint.high is None:
            # A pin may step outside the computed range (a batch the pre-pass
            # would not try, more workers than cores): the user knows best,
            # the device check still applies.
            values[knob] = (constraint.value,)
            continue
        if knob in RANGE_KNOBS and constraint.choices is None:
            counts = [v for v in base[knob] if v is not None]  # num_threads' None (torch's choice) is not a count
            low = constraint.low if constraint.low is not None else min(counts)
            high = constraint.high if constraint.high is not None else max(counts)
            kept = tuple(range(low, high + 1))
        elif constraint.choices is not None:
            kept = tuple(constraint.choices)
        else:
            kept = tuple(v for v in base[knob] if constraint.allows(v))
            if not kept and knob == "batch_size":
                # No power of two in the bounds: the bounds themselves, as pins would be, up to the largest batch.
                largest = (top or {}).get(knob, max(base[knob]))
                kept = tuple(sorted({b for b in (constraint.low, constraint.high) if b is not None and b <= largest}))
        if not kept:
            reason = f"; {why[knob]}" if why and why.get(knob) else ""
            raise UsageError(f"--set {knob}: no value left (searched here: {', '.join(map(shown, base[knob]))}{reason})")
        values[knob] = kept
    return values


def allows(constraints: Iterable[Constraint], knob: str, value: Any) -> bool:
    """Whether the user's ``--set`` items leave ``knob`` free to take ``value``."""
    constraint = merge_constraints(constraints).get(knob)
    return constraint is None or constraint.allows(value)


def allows_workers(constraint: Constraint | None) -> bool:
    """Whether a ``--set num_workers`` constraint (None: not given) leaves a count of one loader worker or more."""
    return constraint is None or any(constraint.allows(n) for n in range(1, INT_LIMITS["num_workers"] + 1))


def excluding(constraints: dict[str, Constraint], setup: TrainSetup) -> str | None:
    """The ``--set`` values ``setup`` does not satisfy, as the user wrote them (``--set num_workers=1``); None if it does.

    A setup without loader workers satisfies every ``prefetch_factor`` and ``persistent_workers`` item: they act on
    the setups that have workers (the space offers 0 workers beside them), so they exclude none without.
    """
    unused = ("prefetch_factor", "persistent_workers") if setup.num_workers == 0 else ()
    said = [f"--set {c}" for knob, c in constraints.items() if knob not in unused and not c.allows(getattr(setup, knob))]
    return " ".join(said) or None


def check_constraints(constraints: dict[str, Constraint], device: DeviceInfo) -> None:
    """Refuse pinned or offered knob values the device cannot run.

    Raises:
        SetupError: ``amp=fp16`` on a CPU, ``amp=bf16`` without native bf16,
            ``pin_memory=true``, ``cudnn_benchmark``, ``tf32``, ``decode=gpu``
            or ``compile=reduce-overhead`` without a GPU, TF32 before Ampere,
            ``optimizer_impl=fused`` where torch has no fused kernels.
    """
    for knob in DEVICE_KNOBS:
        constraint = constraints.get(knob)
        if constraint is None:
            continue
        for value in constraint.choices or (constraint.value,):
            if value is None or value is False:
                continue
            try:
                TrainSetup(**{knob: value}).check_device(device.name, bf16_supported=device.bf16, tf32_supported=device.tf32)
            except SetupError as error:  # worded for the setup's knobs: the user typed --set KNOB=VALUE
                raise in_flag_terms(error, KNOBS) from None


def check_effective_batch(
    effective_batch: int | None, images: int | None, *, constraints: dict[str, Constraint] | None = None, unit: str = "images",
    ranks: int = 1,
) -> None:
    """Refuse an effective batch (one rank's), or ``--set`` batch and accumulation values whose smallest
    optimizer step is, larger than the training data (one rank's share of ``images`` training ``unit``).

    Raises:
        UsageError: An epoch would hold no optimizer step, or every ``--set batch_size`` exceeds the effective batch.
    """
    pinned = (constraints or {}).get("batch_size")
    # The user's figure (every rank's), with one rank's share where there are several.
    said = f"--effective-batch {effective_batch * ranks}" + (f" ({effective_batch} per rank)" if ranks > 1 else "") if effective_batch else ""
    if effective_batch is not None and pinned is not None and _smallest(pinned) > effective_batch:
        raise UsageError(f"--set {pinned}: every micro-batch it allows is larger than {said} "
                         "(micro-batch x accumulation steps = the effective batch)")
    listed = (pinned.choices or (pinned.value,)) if pinned is not None and pinned.low is None and pinned.high is None else ()
    if effective_batch is not None and listed:  # pinned batches the space would refuse only after calibrating
        bad = [int(b) for b in listed if effective_batch % int(b)]
        if bad:
            raise UsageError(f"{said} is not a multiple of batch_size {bad[0]} (--set {pinned})")
    if images is None:
        return
    if effective_batch is not None and effective_batch > images:
        raise UsageError(
            f"{said} is larger than the {images} training {unit}{' of a rank' if ranks > 1 else ''}: an epoch would hold no optimizer step"
        )
    set_by = {knob: _smallest(c) for knob, c in (constraints or {}).items() if knob in ("batch_size", "accumulation_steps")}
    step = set_by.get("batch_size", 1) * set_by.get("accumulation_steps", 1)
    if step > images:
        named = " and ".join(f"--set {knob} (at least {value})" for knob, value in set_by.items())
        raise UsageError(f"{named}: an optimizer step of at least {step} is larger than the {images} training {unit}; "
                         "an epoch would hold no optimizer step")
    workers = (constraints or {}).get("num_workers")
    if workers is not None and not workers.allows(0):  # every setup has a loader queue: it must fit in an epoch
        prefetch = (constraints or {}).get("prefetch_factor")
        least = (_smallest(workers), _smallest(prefetch) if prefetch is not None else 1, set_by.get("batch_size", 1))
        queue = least[0] * least[1] * least[2]
        if queue > images:
            named = " and ".join(f"--set {c}" for c in (workers, prefetch, (constraints or {}).get("batch_size")) if c is not None)
            raise UsageError(f"{named}: the smallest loader queue they allow ({least[0]} workers x prefetch {least[1]} x batch "
                             f"{least[2]} = {queue} samples) is "
                             f"larger than the {images} training {unit}{' of a rank' if ranks > 1 else ''}, which no setup may "
                             f"prefetch; allow fewer workers{' or a smaller prefetch_factor' if prefetch is not None else ''}")


def _fewer(constraints: dict[str, Constraint]) -> str:
    """What a too-large loader queue asks of the user's pins: fewer workers, and a smaller prefetch or batch where pinned."""
    asked = ["fewer workers"] + [f"a smaller {knob}" for knob in ("prefetch_factor", "batch_size") if knob in constraints]
    return ", ".join(asked[:-1]) + " or " + asked[-1] if len(asked) > 1 else asked[0]


def _smallest(constraint: Constraint) -> int:
    """The smallest integer a ``--set`` constraint of an integer knob allows."""
    if constraint.choices is not None:
        return min(int(v) for v in constraint.choices)
    if constraint.low is not None or constraint.high is not None:
        return constraint.low if constraint.low is not None else 1
    return int(constraint.value)


def fit_steps_to_data(values: dict[str, tuple[Any, ...]], constraints: dict[str, Constraint], images: int) -> None:
    """Keep the batch sizes and accumulation steps of ``values`` whose optimizer step, with the smallest partner the
    space allows, fits in one epoch of ``images`` samples: the others could only be sampled and found infeasible
    (``--set accumulation_steps=3`` on 64 samples keeps batches up to 16; ``--set batch_size=32``, accumulations up to 2).

    Args:
        values: The space's candidates per knob, narrowed in place.
        constraints: The ``--set`` constraints (named in the refusal).
        images: Samples in one epoch.

    Raises:
        UsageError: Not even the smallest batch times the fewest steps fits, or the smallest loader queue (fewest
            workers x smallest prefetch x smallest batch) the pins allow is larger than the data: every trial would be
            infeasible, and the PyTorch defaults the pins exclude came back as the result.
    """
    batches, steps = values["batch_size"], values["accumulation_steps"]
    values["batch_size"] = tuple(b for b in batches if b * min(steps) <= images)
    values["accumulation_steps"] = tuple(a for a in steps if a * min(batches) <= images)
    if not values["batch_size"]:
        pins = " ".join(f"--set {constraints[k]}" for k in ("batch_size", "accumulation_steps") if k in constraints)
        raise UsageError(f"{pins or 'the space'}: the smallest optimizer step it allows, batch {min(batches)} x {min(steps)} "
                         f"accumulation, is more than the data's {images} samples: an epoch would hold no optimizer step; "
                         "allow fewer accumulation steps or a smaller batch_size")
    workers, depth, batch = min(values["num_workers"]), min(values["prefetch_factor"]), min(values["batch_size"])
    if not queue_fits(workers, depth, batch, images):
        pins = " ".join(f"--set {constraints[k]}" for k in ("num_workers", "prefetch_factor", "batch_size") if k in constraints)
        raise UsageError(f"{pins or 'the space'}: the smallest loader queue it allows ({workers} workers x prefetch {depth} x "
                         f"batch {batch} = {workers * depth * batch} samples) is larger than the data's {images} samples, "
                         f"which no setup may prefetch; allow {_fewer(constraints)}")
