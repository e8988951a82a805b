"""The winner of a search and what limits it.

Turns the finished trials and the confirmation rounds into the ``best.json``
record (with the notes a user must read) and a one-line bottleneck verdict.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Sequence
from typing import Any

from autotune.epochs import epoch_notes
from autotune.output.best import MEDIANS_APART_NOTE, PAIRED_SO_FAR, Best, scaled_lr
from autotune.output.compile_payoff import payoff_note
from autotune.records import TrialRecord, Workload
from autotune.redact import hide_passwords
from autotune.rounds import Confirmed
from autotune.runner.measure import busy_threshold
from autotune.train_setup import TrainSetup
from autotune.tuner.choice import choose_winner
from autotune.tuner.constraints import Constraint
from autotune.tuner.diverged import diverged_in_rounds, diverged_math, diverged_note
from autotune.tuner.noise import beats, compared_ratios, disagree, paired_ratios, paired_speedup
from autotune.tuner.offered import precision_note
from autotune.tuner.space import DEFAULT_BATCH
from autotune.units import counted
from autotune.workloads.streams import UNSHARDED


def make_best(
    *,
    workload: Workload,
    hardware: Any,
    feasible: list[TrialRecord],
    confirmed: list[Confirmed],
    defaults: TrainSetup,
    effective_batch: int | None,
    command: str,
    interrupted: bool = False,
    world_size: int = 1,
    excluded_by: str | None = None,
    partial: tuple[Confirmed, ...] = (),
    batch_pin: Constraint | None = None,
    defaults_ran: bool = True,
    stopped_by: str = "",
    tried: Sequence[TrialRecord] = (),
    amp_pin: Constraint | None = None,
) -> Best:
    """The ``best.json`` record: the confirmed winner, its speedup and the notes.

    Args:
        workload: What was trained.
        hardware: The probe's ``Hardware`` (its summary is recorded).
        feasible: The trials that measured a throughput.
        confirmed: The confirmation rounds; empty when they did not run,
            and the fastest single trial is then the (unconfirmed) winner.
        defaults: The PyTorch-defaults setup of this search.
        effective_batch: The pinned ``--effective-batch``, or None.
        command: The command line, for the record.
        interrupted: The search was stopped (Ctrl-C, SIGTERM, SIGHUP).
        world_size: Ranks per trial; the effective batch counts every rank.
        excluded_by: The user's ``--set`` that the defaults do not satisfy
            (``--set num_workers=1``): they stay the baseline, and are the winner
            only when no setup within it measured a throughput.
        partial: The rounds an interrupted confirmation measured (the note says so): where the pick and the defaults
            shared a round, the speedup is their paired ratio there, not the ratio of two single trials run minutes apart.
        batch_pin: The user's ``--set batch_size=...``, if any: the note's way to keep the math respects it.
        defaults_ran: A trial of the defaults finished (with or without a throughput); False when the search
            stopped before their trial (a resumed search runs the defaults interrupted earlier again, last).
        stopped_by: What stopped an ``interrupted`` search, where it was no signal (``bad data: PATH: ...``).
        tried: Every trial of the search: with the confirmation's runs, which training math diverged
            (:mod:`autotune.tuner.diverged`): no setup of it wins, and a note says so.
        amp_pin: The user's ``--set amp=...``, if any: one that leaves float32 out keeps an unstable precision's other
            batches (:meth:`~autotune.tuner.diverged.Unstable.exact`).
    """
    default_key = defaults.to_json()
    # The batch the defaults run, as the user's own loop would: the recipe's, or all the samples where the data holds fewer
    # (a DataLoader's one batch of them, which the recipe's lr then trains).
    reference = effective_batch or defaults.effective_batch(world_size)
    recipe = workload.reference_batch or DEFAULT_BATCH
    notes: list[str] = []
    rounds: list[float] = []  # the winner's paired ratios over the defaults, which the speedup is the median of
    unstable = diverged_math(tried, [*confirmed, *partial])  # an interrupted confirmation's rounds count too
    kept_by = None if amp_pin is None or amp_pin.allows("off") else f"--set {amp_pin}"
    shaky = unstable.exact() if kept_by else unstable  # a --set that leaves float32 out keeps the precision's other batches
    # A finalist whose math diverged in a run, its own or another's, finished its other runs by luck: never the winner.
    measured = [c for c in confirmed if c.median is not None and (c.candidate.key == default_key or c.candidate.setup not in shaky)]
    if measured:
        dropped = any(c.candidate.key != default_key and c.candidate.setup in shaky for c in confirmed)  # measured or not
        chosen, why = choose_winner(measured, default_key, reference // world_size, excluded_by, diverged=dropped)
        setup, rate, spread = chosen.candidate.setup, chosen.median or 0.0, chosen.spread or 0.0
        baseline = next((c for c in measured if c.candidate.key == default_key), None)
        base = baseline.median if baseline is not None else None
        # The defaults measured alone (--trials 1) have no ratio: "1.00x ... median of the paired rounds" paired nothing.
        speedup = paired_speedup(chosen, baseline) if baseline is not None and len(measured) > 1 else None
        rounds = sorted(r for r in paired_ratios(chosen, baseline) if r > 0) if speedup and baseline is not None and baseline is not chosen else []
        notes.extend(why)
        failed = [r for r in tried if r.result.status in ("error", "timeout") and r.result.error and r.setup != defaults]
        # Nothing within the --set measured (choose_winner returned the defaults it excludes): one cause for all, often the machine's.
        if excluded_by is not None and failed and all(c.candidate.key == default_key for c in measured):
            notes.append(f"{counted(len(failed), 'trial')} within it failed, the first so: #{failed[0].number} {failed[0].result.error}")
        diverged_here = diverged_in_rounds(confirmed)  # said by the divergence note, not as a lost measurement
        for lost in (c for c in confirmed if c.failures and not c.values and c.candidate.key != default_key and c not in diverged_here):
            # A finalist whose trial ran and whose every confirmation run failed: its trial's figure names no winner.
            notes.append(f"the finalist {lost.candidate.label} failed in every confirmation run ({lost.failures[0]})" + (
                "" if lost.candidate.twin else ": the figure its trial measured is not what it sustains, so it is not the winner"))
        if baseline is not None and baseline is not chosen and speedup is not None and disagree(chosen, baseline):
            ratios = compared_ratios(chosen, baseline)
            over = (f"{len(ratios)} of {len(rounds)} rounds, the one farthest from their median left out" if len(rounds) > len(ratios)
                    else f"{len(rounds)} rounds")
            notes.append(f"the winner's paired rounds against the PyTorch defaults disagree (ratios {ratios[0]:.3g}x to "
                         f"{ratios[-1]:.3g}x over {over}): the load on the machine changed within rounds, which "
                         f"pairing does not cancel, so the {speedup:.2f}x speedup is no figure to rely on; run the search "
                         "again on an idle machine")
        elif baseline is not None and baseline is not chosen and speedup and base and rate and (
                abs(math.log(speedup * base / rate)) > math.log(MEDIANS_APART)):  # the line's three figures disagree
            each = ", ".join(f"{r:.2f}x" for r in rounds)
            notes.append(f"the {speedup:.2f}x {MEDIANS_APART_NOTE} ({each}); the two "
                         f"medians ({rate:.1f} against {base:.1f} samples/s) are {rate / base:.2f}x apart: each comes from "
                         "its own runs (the load changed between rounds, or one of them ran fewer rounds), which the "
                         "pairing of each round's two runs cancels")
        if chosen.candidate.no_twin and setup.amp != "off":
            notes.append(f"the winner's float32 twin was not re-measured: {chosen.candidate.no_twin}, so the same setup in "
                         "float32 would be clearly slower")
    else:
        steady = [r for r in feasible if r.setup not in shaky]
        allowed = [r for r in steady if excluded_by is None or r.setup.to_json() != default_key] or steady
        fastest = max(allowed or feasible, key=lambda r: r.result.samples_per_s or 0.0)
        # An interrupted confirmation's rounds rank side by side: one ahead of the fastest trial there leads (defaults 63 alone, 12 there).
        top = _ahead_in_rounds(fastest, allowed or feasible, partial) or fastest
        if excluded_by is not None and top.setup.to_json() == default_key and steady != feasible:
            notes.append(f"every setup within {excluded_by} that measured trains math that diverged: the PyTorch defaults, "
                         "which it excludes, are returned")
        setup, rate, spread = top.setup, top.result.samples_per_s or 0.0, top.result.samples_per_s_spread or 0.0
        base_records = [r for r in feasible if r.setup.to_json() == default_key]
        # The defaults' median over the trials that measured them (a repeat of a setup carries its earlier trial's figure:
        # counted again, it would weigh that one twice): one of them measured beside a load no longer sets the speedup alone.
        ran_base = [r for r in base_records if r.ran] or base_records
        base = statistics.median(r.result.samples_per_s or 0.0 for r in ran_base) if ran_base else None
        speedup = rate / base if base else None
        pick, baseline = (next((c for c in partial if c.candidate.setup.to_json() == key and c.values), None)
                          for key in (setup.to_json(), default_key))
        paired = None
        if pick is not None and baseline is not None and (paired := paired_speedup(pick, baseline)) is not None:
            speedup, base, rate, spread = paired, baseline.median, pick.median or rate, pick.spread or 0.0  # all from those rounds
            rounds = sorted(r for r in paired_ratios(pick, baseline) if r > 0) if pick is not baseline else []
        stopped, rerun = (f"the search was stopped by {stopped_by}", "fix it, then rerun") if stopped_by else ("the search was interrupted", "rerun")
        if interrupted and any(c.values for c in partial):
            shared = f" ({PAIRED_SO_FAR})" if paired is not None else ""
            ranked = (f"#{top.number} ran ahead of the fastest trial #{fastest.number} in the rounds both ran" if top is not fastest
                      else "too few to rank")
            notes.append(f"not confirmed: {stopped} during the interleaved re-measurement "
                         f"(its rounds so far are shown, {ranked}; {rerun} the same command to confirm){shared}")
        elif interrupted:
            notes.append(f"not confirmed: {stopped} before the interleaved re-measurement")
        else:
            notes.append("not confirmed: every confirmation run failed; the fastest single trial is shown")
    peaks = [r.result.peak_memory_bytes for r in feasible if r.setup == setup and r.result.peak_memory_bytes]
    peaks += [c.peak_bytes for c in confirmed if c.candidate.setup == setup and c.peak_bytes]  # the fp32 twin ran there only
    if not peaks and any(c.candidate.setup == setup and c.values for c in confirmed):  # a twin: autotune/runner/held.py
        notes.append("peak memory not measured: no trial of this setup measured it, and its confirmation runs gave none (one "
                     "beside held finalists reads low; a resumed confirmation keeps no peaks)")
    effective = setup.effective_batch(world_size)
    lr = scaled_lr(workload.lr, effective, reference, workload.lr_scaling)
    if workload.data is None and workload.task is None:
        notes.append("measured on synthetic JPEGs; re-run with --data DIR to tune on your own images")
    if setup.amp != "off":
        notes.append(f"amp={setup.amp} changes the numerics (autocast); check your accuracy once")
    elif note := precision_note(workload):
        notes.append(note)
    step = setup.batch_size * setup.accumulation_steps  # one rank's optimizer step; an epoch holds whole steps only
    notes.extend(epoch_notes(workload.images, step, max(1, reference // world_size), "samples" if workload.task else "images",
                             " of a rank" if world_size > 1 else ""))
    cores = int(getattr(getattr(hardware, "cpu", None), "usable_cores", 0) or 0)
    if workload.unsharded and cores > 1:  # the calibration's log said it once
        notes.append(f"the dataset: {UNSHARDED}, so the search kept num_workers <= 1: split the stream in its __iter__ by "
                     "torch.utils.data.get_worker_info() (a Task takes no worker_init_fn) to let more workers load it")
    if workload.iterable and world_size > 1:
        notes.append(f"the dataset is an IterableDataset, which each of the {world_size} ranks iterates itself (autotune "
                     "shards no stream): samples/s counts every rank's items, copies of one another unless its __iter__ "
                     "splits the stream by torch.distributed.get_rank() (docs/distributed.md)")
    if setup.tf32:
        notes.append("tf32 changes the numerics (float32 matmuls and convolutions in TF32); check your accuracy once")
    if setup.accumulation_steps > 1 and workload.batch_norm is not False:  # the optimizer's batch is kept; batch statistics are not
        layer = "the model's BatchNorm layers compute their" if workload.batch_norm else "a BatchNorm layer (where the model has one) computes its"
        notes.append(f"accumulation keeps the optimizer's step of {setup.effective_batch(world_size)} samples, but {layer} "
                     f"statistics over each micro-batch of {setup.batch_size}"
                     f"{' per rank' if world_size > 1 else ''}: check your accuracy once, or --set accumulation_steps=1")
    elif world_size > 1 and workload.batch_norm is not False:  # DDP normalises per rank, as trials and train.py run it
        layer = "the model's BatchNorm layers compute their" if workload.batch_norm else "a BatchNorm layer (where the model has one) computes its"
        notes.append(f"under DDP {layer} statistics over each rank's batch of {setup.batch_size}, not the step's "
                     f"{setup.effective_batch(world_size)} samples (torch.nn.SyncBatchNorm would, at a cost these trials did not measure)")
    payoff = payoff_note(feasible, setup)
    if payoff:
        notes.append(payoff)
    busy = load_note(feasible, cores)
    if busy:
        notes.append(busy)
    drift = drift_note(feasible, measured)
    if drift:
        notes.append(drift)
    # --effective-batch R searches micro-batches that divide R: the hint must be one the user's --set batch_size allows.
    fits = batch_pin is None or any(batch_pin.allows(b) for b in range(1, reference // world_size + 1) if reference % (b * world_size) == 0)
    keep = (f"pass --effective-batch {reference} to keep the math" if fits else
            f"to keep the math, pass --effective-batch {reference} with a --set batch_size that divides it (--set {batch_pin} allows none)")
    if effective_batch is None and effective != reference and workload.lr_scaling == "none":
        notes.append(f"effective batch {effective} differs from the reference {reference}: the learning rate is kept at {lr:g}, "
                     "as your optimizer's step size is set by the rate, not the gradient's scale (sign-based, orthogonalized, "
                     f"line-search or parameter-free: no batch rule applies); the trials measured speed only, so check the "
                     f"training at this batch once; {keep}")
    elif effective_batch is None and effective != reference:
        rule = (
            f"by the square root of the batch ratio, {lr / workload.lr:.3g}x to {lr:g} (the square-root rule for "
            "adaptive optimizers such as AdamW, Malladi et al. 2022)"
            if workload.lr_scaling == "sqrt"
            else f"linearly with the batch, {lr / workload.lr:.3g}x to {lr:g} (the linear rule for SGD, Goyal et al. 2017)"
        )
        notes.append(f"effective batch {effective} differs from the reference {reference}: the learning rate is scaled {rule}; "
                     f"the trials measured speed at your rate, so the scaled one is a rule, not tested for stability here "
                     f"(train.py stops on a NaN loss: then lower --lr); {keep}")
    if effective_batch is None and reference < recipe * world_size:
        whose = f"{'your recipe' if workload.reference_batch else 'the default'}'s batch {recipe}"
        if workload.images is None:  # a stream's pass, whose length is not known: its largest full batch ran as the defaults
            notes.append(f"a pass of the stream yields no full batch of {whose}{' per rank' if world_size > 1 else ''}: the "
                         f"defaults ran its largest full batch, so your lr {workload.lr:g} is taken as the rate for batch {reference}")
        else:
            notes.append(f"the data holds {counted(workload.images, 'sample')}{' per rank' if world_size > 1 else ''}, fewer than "
                         f"{whose}: a DataLoader's batch holds them all, as the defaults ran, so your lr {workload.lr:g} is taken as "
                         f"the rate for batch {reference}")
    if effective_batch is not None and workload.reference_batch is not None and effective_batch != recipe * world_size:
        ranks = f" ({recipe} per rank)" if world_size > 1 else ""
        notes.append(f"your lr {workload.lr:g} is taken as tuned for --effective-batch {effective_batch}, as given, not for the "
                     f"Task's batch_size {recipe * world_size}{ranks}: train.py uses it unscaled "
                     f"(scale it yourself if it was tuned for {recipe * world_size})")
    if effective_batch is not None and defaults.batch_size < min(recipe, workload.images or recipe):
        per_rank = f" ({effective_batch // world_size} per rank)" if world_size > 1 else ""
        notes.append(f"the PyTorch defaults ran batch {defaults.batch_size} x {defaults.accumulation_steps} accumulation steps, "
                     f"the largest batch up to {'your recipe' if workload.reference_batch else 'the default'}'s {recipe} "
                     f"that divides --effective-batch {effective_batch}{per_rank}: the math every setup keeps")
    if base is None and not defaults_ran:
        notes.append(f"the PyTorch defaults ({defaults.describe()}) were not measured yet: the search stopped before their "
                     "trial, so no speedup is given; rerun the same command to measure them")
    elif base is None:
        scaled = (f"; the learning rate is still scaled from their batch {reference}, your recipe's, which did not train here"
                  if setup.effective_batch(world_size) != reference and workload.lr_scaling != "none" else "")
        notes.append(f"the PyTorch defaults ({defaults.describe()}) could not be measured: their trial ended without a "
                     f"throughput (trials.csv gives its status and error), so no speedup is given{scaled}")
    if (diverged := diverged_note(tried, workload, [*confirmed, *partial], unstable, kept_by)) is not None:
        notes.append(diverged)
    if setup in shaky:  # the defaults, kept as the baseline whatever diverged, or the last resort of a stop
        who = f"the PyTorch defaults ({setup.describe()}), returned as the baseline, are" if setup == defaults else f"{setup.describe()}, returned, is"
        notes.append(f"{who} the exception: the same batch, accumulation and precision as a run that diverged, so "
                     f"{'your recipe itself' if setup == defaults else 'it'} would likely diverge in a longer run")
    hw = hardware.to_dict()
    return Best(
        setup=setup,
        workload=workload,
        samples_per_s=rate,
        samples_per_s_spread=spread,
        defaults_samples_per_s=base,
        speedup=speedup,
        speedup_rounds=tuple(rounds),
        peak_memory_bytes=max(peaks) if peaks else None,
        effective_batch=effective,
        reference_batch=reference,
        lr=lr,
        hardware=hw,
        versions=dict(hw.get("software", {})),
        command=hide_passwords(command),
        created=_dt.datetime.now().astimezone().isoformat(timespec="seconds"),  # the local offset: autotune.tuner.study_files
        notes=tuple(notes),
        world_size=world_size,
        confirmed=bool(measured),
        torch_threads=None if setup.num_threads is not None else next(
            (r.result.num_threads for r in feasible if r.setup == setup and r.result.num_threads), None),
    )



def load_note(feasible: list[TrialRecord], usable_cores: int) -> str | None:
    """The note for best.json when other processes kept cores busy while the trials measured.

    Threads, workers and batch that win on a busy machine (fewer threads, say)
    may lose on an idle one: the user should know which machine was tuned for.
    """
    ran = [r for r in feasible if r.result.other_cores is not None and r.ran]
    loads = [r.result.other_cores or 0.0 for r in ran]
    busy = busy_threshold(usable_cores)  # the median over the trials from which the figures say so
    of = f" of the {usable_cores} usable core{'s' if usable_cores != 1 else ''}" if usable_cores else " cores"
    # A load that came and went (a backup job mid-search): the median is idle, but the trials it met read low.
    spikes = [r for r in ran if (r.result.other_cores or 0.0) >= max(2 * busy, 0.5)]
    if loads and statistics.median(loads) < busy and spikes:
        said = ", ".join(f"#{r.number}: {r.result.other_cores:.1f}" for r in spikes[:6]) + (", ..." if len(spikes) > 6 else "")
        return (f"the load changed during the search: other processes kept up to {max(loads):.1f}{of} busy during "
                f"{counted(len(spikes), 'trial')} of the {len(ran)} measured to the end ({said}), against a median of {statistics.median(loads):.1f} "
                "(trials.csv column other_cores): "
                "their figures read low, so a setup they measured may be missing from the finalists; run the search again on "
                "an idle machine to compare every setup alike")
    if not loads or statistics.median(loads) < busy:
        return None
    return (
        f"other processes kept {statistics.median(loads):.1f}{of} busy while the trials measured (median over "
        f"{counted(len(loads), 'trial')}, up to {max(loads):.1f}; trials.csv column other_cores): the figures and the winner hold "
        "for a machine that busy; run the search again on an idle machine to tune for one"
    )


#: A finalist whose confirmation median is this many times above or below its trial: the machine's load changed meanwhile.
DRIFT = 2.0


def drift_note(feasible: list[TrialRecord], measured: list[Confirmed]) -> str | None:
    """The note for best.json when a finalist's confirmation and its own trial disagree by more than :data:`DRIFT` times.

    Noise moves a setup by 20-30 % between runs; more means something else took
    or gave back the machine between the trial and the rounds. The ranking and
    the speedup rest on the paired rounds, but the user should know.
    """
    far = []
    for confirmed in measured:
        trial = max((r.result.samples_per_s or 0.0 for r in feasible if r.setup == confirmed.candidate.setup), default=0.0)
        if trial and confirmed.median and not 1 / DRIFT <= confirmed.median / trial <= DRIFT:  # the label names that trial
            far.append(f"{confirmed.candidate.label}: {confirmed.median:.1f} samples/s in the rounds, {trial:.1f} in its trial")
    if not far:
        return None
    return (f"the confirmation rounds and the trials disagree by more than {DRIFT:g}x ({'; '.join(far)}): the load on the "
            "machine changed while the search ran (trials.csv column other_cores); the winner and "
            "the speedup come from the paired rounds, but run the search again on an idle machine before relying on them")


def _ahead_in_rounds(top: TrialRecord, others: list[TrialRecord], partial: tuple[Confirmed, ...]) -> TrialRecord | None:
    """The trial whose setup beat ``top``'s in the rounds both ran (:func:`~autotune.tuner.noise.beats`: beyond the noise
    floor, in 3 of 4 rounds) by the most, or None when none did or ``top``'s setup ran no round."""
    rounds = {c.candidate.key: c for c in partial if c.values}
    mine = rounds.get(top.setup.to_json())
    if mine is None:
        return None
    ahead = {r.number: paired_speedup(rounds[r.setup.to_json()], mine) or 0.0 for r in others
             if r.setup.to_json() in rounds and r.setup != top.setup and beats(rounds[r.setup.to_json()], mine)}
    best = max(ahead, key=lambda n: ahead[n], default=None)
    return next((r for r in others if r.number == best), None)


#: The speedup (a median of paired ratios) this far from the ratio of the two medians beside it: a note says both.
MEDIANS_APART = 1.15

