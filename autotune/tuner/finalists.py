"""Who enters the confirmation: the fastest distinct setups of the search, their float32 twins where precision must
earn its place, and the PyTorch defaults for the speedup; and how the rounds name each of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autotune.records import Calibration, TrialRecord
from autotune.rounds import Candidate
from autotune.train_setup import TrainSetup
from autotune.tuner.diverged import diverged_math
from autotune.tuner.noise import NOISE_FLOOR
from autotune.tuner.study import ROLE_DEFAULTS

#: A finalist's reduced precision that the calibration measured at least this many times faster than float32 (computing
#: alone, same batch and layout) needs no fp32 twin when the finalist is compute-bound (:data:`COMPUTE_BOUND`): its twin
#: would run at about the inverse (0.71x), below :data:`~autotune.tuner.confirm.CLEARLY_SLOWER`, with room for the calibration's own noise.
CLEAR_GAIN = 1.4

#: A trial that waited on the loader at most this share of its measured time is compute-bound: a slower step in float32
#: slows the loop by as much.
COMPUTE_BOUND = 0.05


#: Said where a rerun that added no trial takes the study's last finished confirmation of the same finalists.
REUSED = ("confirmation: no trial was added since the study's last confirmation of these finalists: its rounds stand "
          "(a rerun measuring them again, under another load, replaced a confirmed winner by the defaults); pass more "
          "--confirm-rounds or --trials to measure again")


def autocasts_as(setup: TrainSetup, twin: TrainSetup) -> bool:
    """Whether ``setup`` is in reduced precision and ``twin`` is the same setup in float32 (bf16 and fp16 share one twin)."""
    return setup.amp != "off" and setup.replace(amp="off") == twin


#: The label of a finalist no trial ran: a finalist's twin in float32.
TWIN = " (a finalist in fp32)"
#: The label's mark for the defaults confirmed after their trial timed out (no trial measured them).
TIMED_OUT = " (timed out in its trial)"


def finalist_label(same: Sequence[TrialRecord]) -> str:
    """A finalist's name in the confirmation: the fastest trial of its setup (``same``, fastest first), marked when
    the PyTorch defaults' trial ran it. The search and any reader of the stored rounds name it alike."""
    tag = " (defaults)" if any(r.role == ROLE_DEFAULTS for r in same) else ""
    return f"#{same[0].number} {same[0].setup.describe()}{tag}"


def autocast_evident(record: TrialRecord, calibration: Calibration | None) -> str | None:
    """Why ``record``'s setup needs no fp32 twin in the confirmation, or None when it does.

    Its reduced precision computed at least :data:`CLEAR_GAIN` times faster
    than float32 in the calibration (computing alone, same layout, like for
    like at the probe batch), and its trial waited on the loader at most
    :data:`COMPUTE_BOUND` of its time: the float32 step, that much slower,
    would slow the loop as much. Eager setups without TF32 only (the
    calibration measured neither compilation nor TF32), at the probe batch
    or a larger one (a small batch may leave a CPU's bf16 units idle), and only where the other layout's pair, if
    measured, does not say the opposite (the reduced precision slower than float32 there: figures that disagree in
    direction are no evidence to skip a measurement on).
    """
    setup, wait = record.setup, record.result.data_wait_fraction
    if (calibration is None or setup.amp == "off" or setup.compile != "off" or setup.tf32 or setup.batch_size < calibration.probe_batch
            or wait is None or wait > COMPUTE_BOUND):
        return None
    rates = {(p.amp, p.channels_last): p.samples_per_s for p in calibration.precisions if p.status == "ok" and p.samples_per_s}
    fast, slow = rates.get((setup.amp, setup.channels_last)), rates.get(("off", setup.channels_last))
    if not fast or not slow or fast < CLEAR_GAIN * slow:
        return None
    other_fast, other_slow = rates.get((setup.amp, not setup.channels_last)), rates.get(("off", not setup.channels_last))
    if other_fast and other_slow and other_fast < other_slow:
        return None
    layout = "channels_last" if setup.channels_last else "contiguous"
    return (f"the calibration measured {setup.amp} {fast / slow:.2f}x float32 computing alone ({layout}, batch "
            f"{calibration.probe_batch}) and its trial waited on the loader {wait:.0%} of the time")


def pick_candidates(records: Sequence[TrialRecord], defaults: TrainSetup, top: int, *, fp32_twin: bool = False,
                    calibration: Calibration | None = None, baseline_only: bool = False, fp32_allowed: bool = True) -> list[Candidate]:
    """The ``top`` fastest distinct setups, then the defaults (when they ran, or their trial timed out) for the speedup.

    A compiled setup is a finalist only when its trial was faster than the
    same setup eager by the noise floor: compiling is paid at every start of
    training (and in every confirmation round), so a gain within the noise
    does not earn it a place.

    With ``fp32_twin`` (the space offers ``amp=off``), each finalist in
    reduced precision is joined by its twin in float32, every other knob
    alike, when no finalist is that twin: precision changes the numerics, so
    whichever wins the rounds must win against the same setup without it (a
    setup in float32 that wins by its loader knobs says nothing about the
    precision). A twin is labelled
    :data:`TWIN` when no trial ran it, and left out when trials ran it and
    none finished (stopped early as clearly slower, out of memory, failed):
    two more runs would only repeat that; nor does a twin join a finalist
    whose precision ``calibration`` already measured clearly faster where it
    is compute-bound (:func:`autocast_evident`; every finalist sharing that
    twin, and no trial of the twin finished): it would stop after one round.

    Args:
        records: The search's trials; those that measured a throughput compete.
        defaults: The PyTorch defaults' setup.
        top: How many distinct setups.
        fp32_twin: Whether the finalists' float32 twins may join.
        calibration: The search's calibration (its like-for-like precisions), or None: every twin joins.
        baseline_only: Whether the user's ``--set`` excludes the defaults: they cannot win, so they take none
            of the ``top`` places and join after the finalists for the speedup alone.

    A setup whose training math (:func:`~autotune.tuner.diverged.math_of`) diverged in another trial is no finalist,
    nor a twin: its own trial finished by luck over a few seconds; nor is one in a reduced precision that diverged at
    several batches (:class:`~autotune.tuner.diverged.Unstable`), unless a ``--set`` leaves float32 out
    (``fp32_allowed`` False). The defaults still join for the speedup.
    """
    unstable = diverged_math(records)  # a setup whose math diverged in another trial finished by luck: no finalist
    if not fp32_allowed:  # a --set leaves float32 out: the other batches of an unstable precision stay
        unstable = unstable.exact()
    feasible = [r for r in records if r.result.ok and r.result.samples_per_s and r.setup not in unstable]
    ranked = sorted(feasible, key=lambda r: r.result.samples_per_s or 0.0, reverse=True)
    eager = {r.setup.to_json(): r.result.samples_per_s or 0.0 for r in feasible if r.setup.compile == "off"}
    by_setup: dict[str, list[TrialRecord]] = {}
    for record in ranked:
        by_setup.setdefault(record.setup.to_json(), []).append(record)
    candidates: list[Candidate] = []
    for key, same in by_setup.items():
        if baseline_only and key == defaults.to_json():
            continue
        record = same[0]
        twin = eager.get(record.setup.replace(compile="off").to_json()) if record.setup.compile != "off" else None
        if twin is not None and (record.result.samples_per_s or 0.0) < twin * (1.0 + NOISE_FLOOR):
            continue
        candidates.append(Candidate(key, record.setup, finalist_label(same)))
        if len(candidates) == top:
            break
    finalists = list(candidates)
    for finalist in finalists if fp32_twin else []:  # any of them may win: each must beat its twin
        if finalist.setup.amp == "off":
            continue
        fp32 = finalist.setup.replace(amp="off")
        if fp32.to_json() in {c.key for c in candidates} or fp32 in unstable:
            continue
        ran = by_setup.get(fp32.to_json())
        sharing = [c for c in finalists if autocasts_as(c.setup, fp32)]
        evident = {c.key: autocast_evident(by_setup[c.key][0], calibration) for c in sharing}
        if not ran and all(evident.values()):  # a trial of the twin that finished is a measurement: it joins
            candidates = [replace(c, no_twin=evident[c.key]) if c.key in evident else c for c in candidates]
            continue
        if ran:
            candidates.append(Candidate(fp32.to_json(), fp32, finalist_label(ran)))
        elif not any(r.setup == fp32 and r.result.status != "interrupted" for r in records):  # none finished: left out
            candidates.append(Candidate(fp32.to_json(), fp32, fp32.describe() + TWIN, twin=True))
    default_key, timed_out = defaults.to_json(), [r for r in records if r.setup == defaults and r.result.status == "timeout"]
    baseline = sorted((r for r in records if r.setup == defaults and r.result.ok and r.result.samples_per_s),  # unstable or not
                      key=lambda r: -(r.result.samples_per_s or 0.0))
    if default_key not in {c.key for c in candidates} and baseline:
        candidates.append(Candidate(default_key, defaults, finalist_label(baseline)))
    elif default_key not in {c.key for c in candidates} and timed_out:  # a busy moment, say: the speedup needs its rounds
        candidates.append(Candidate(default_key, defaults, finalist_label(timed_out) + TIMED_OUT, timed_out=True))
    return candidates
