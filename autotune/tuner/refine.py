"""``torch.compile`` as a refinement of the leading setup, not a sampled knob.

Compiling costs tens of seconds on a CPU (minutes for large models) in every
trial that compiles; sampling it in every trial would spend most of a
search's time compiling setups that lose anyway. So sampled trials run
eagerly, and the last trials of the budget (one per compiled mode the space
offers) re-run the fastest eager setup so far with the model compiled. They
are ordinary trials of the study (role ``compile``): recorded, confirmed
against the eager winner when they lead, resumed after an interruption.
Searches of fewer than :data:`MIN_TRIALS` trials do not compile: one compiled
trial costs the wall time of several eager ones (compilation, then again in
every confirmation round it reaches), which a short search spends better on
the sampled knobs.
"""

from __future__ import annotations

from collections.abc import Callable

from optuna.trial import TrialState

from autotune.train_setup import TrainSetup
from autotune.tuner.budget import FINISHED, progress
from autotune.tuner.space import Space
from autotune.tuner.study import ATTR_ROLE, SearchStudy
from autotune.units import counted

ROLE_COMPILE = "compile"
#: The trial attribute holding the setup a compile trial runs.
ATTR_COMPILE_SETUP = "compile_setup"
#: Searches shorter than this spend no trial on compiling.
MIN_TRIALS = 20


def compile_trials(space: Space, wanted: int) -> int:
    """Trials of the budget kept for compiled runs of the leader."""
    return len(space.compile_modes()) if wanted >= MIN_TRIALS else 0


def compile_skipped(space: Space, wanted: int) -> str:
    """The end of the ``space:`` line when the space offers compiled modes that a search of ``wanted`` trials never tries.

    Returns:
        ``; compile=default not tried: ...`` naming the pin that compiles every trial, or ``""`` where nothing is left untried.
    """
    modes = space.compile_modes()
    if not modes or compile_trials(space, wanted):
        return ""
    return (f"; compile={'|'.join(modes)} not tried: a search of {counted(wanted, 'trial')} (under {MIN_TRIALS}) compiles no trial; "
            f"--set compile={modes[0]} compiles every trial")


def enqueue_compile_trials(study: SearchStudy, space: Space, wanted: int, allowed: Callable[[TrainSetup], bool] = lambda setup: True) -> None:
    """Once the eager trials of the budget are done, queue the fastest eager setup that may lead (``allowed``: not the
    PyTorch defaults a ``--set`` excludes, the baseline only) compiled in each offered mode it has not run in: at the end
    of each budget a rerun with a larger ``--trials`` adds, where a new leader came up (before, once per study: an
    extended search confirmed the old leader compiled beside a new one never compiled)."""
    count = compile_trials(space, wanted)
    if not count:
        return
    live = study.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.WAITING, TrialState.RUNNING))
    done, running = progress(live, wanted)  # running: other workers' trials too
    compiled = [t for t in live if t.user_attrs.get(ATTR_ROLE) == ROLE_COMPILE]
    if not wanted - count <= done + running < wanted or any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in compiled):
        return
    eager = [r for r in study.records() if r.result.ok and r.result.samples_per_s and r.setup.compile == "off" and allowed(r.setup)]
    if not eager:
        return
    leader = max(eager, key=lambda r: r.result.samples_per_s or 0.0).setup
    tried = [t.user_attrs.get(ATTR_COMPILE_SETUP) for t in compiled]
    untried = [setup for mode in space.compile_modes() if (setup := leader.replace(compile=mode)).to_dict() not in tried]
    for setup in untried[: wanted - done - running]:  # no more than the budget has slots for: one left over would wait
        study.study.enqueue_trial({}, user_attrs={ATTR_ROLE: ROLE_COMPILE, ATTR_COMPILE_SETUP: setup.to_dict()})


def compile_setup(attrs: dict[str, object]) -> TrainSetup:
    """The setup a queued compile trial runs."""
    data = attrs[ATTR_COMPILE_SETUP]
    assert isinstance(data, dict)
    return TrainSetup.from_dict(data)
