"""What runs inside a trial process.

Builds the workload, applies the setup, warms up, measures steady-state
windows and sends events to the parent (see :mod:`autotune.runner.zygote` for
the transport): one ``window`` event per measured window, then one ``result``
event (:mod:`autotune.runner.entry` turns any failure into a result).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner.failures import BudgetExceeded, CompileFailed, Diverged, compile_fix, compile_reason
from autotune.runner.measure import LoadMeter, MemoryMonitor, Stopwatch, start_cuda, summarize, sync
from autotune.runner.ranks import Rank
from autotune.runner.windows import Work, may_close, more_windows
from autotune.train_setup import TrainSetup
from autotune.units import format_bytes
from autotune.workloads.batches import to_device
from autotune.workloads.modes import eval_modules, train_mode
from probes.cpu import usable_cores

if TYPE_CHECKING:  # pragma: no cover
    from autotune.workloads.production import ProductionClock

Send = Callable[[dict[str, Any]], None]


#: Samples in the synthetic step of an eager CPU trial (see :meth:`TrialLoop.synthetic_step`).
SYNTHETIC_CPU_BATCH = 8


class TrialLoop:
    """The training loop of one trial: built once, warmed up, measured."""

    def __init__(
        self, setup: TrainSetup, workload: Workload, options: TrialOptions, *, started: float, send: Send, rank: Rank | None = None
    ) -> None:
        import torch

        self.started = started
        self.send = send
        self.setup = setup
        self.workload = workload
        self.options = options
        self.rank = rank = rank or Rank()
        self.device = torch.device(rank.device(workload.device))
        self.device_type = self.device.type
        self.compile_s: float | None = None
        self.clock: ProductionClock | None = None  # the loader workers' own timing, once the loader starts
        self.work: Work | None = None  # built by the first run(); a held trial's next rounds run it again
        budget = options.max_memory_bytes if self.device_type == "cpu" else None
        # On CUDA the allocator reports the peak; no thread samples the host.
        self.monitor = MemoryMonitor(budget_bytes=budget, enabled=self.device_type == "cpu").start()
        if self.device_type == "cuda":
            start_cuda(self.device)
        rank.start(self.device)
        torch.manual_seed(options.seed)
        self.data_wait = Stopwatch()
        self.bad = None  # device tensor: any non-finite loss so far
        from autotune.workloads.pipeline import open_pipeline

        self.pipeline = open_pipeline(workload, decode=setup.decode)
        # Threads, cuDNN autotuning, TF32: before the model runs, after the Task's factory and its module, whose own
        # torch.set_num_threads would otherwise stand in every trial whatever its num_threads.
        setup.configure_torch(self.device)
        self.decoder = None
        if setup.decode == "gpu":
            from autotune.workloads.gpu_decode import GpuDecoder

            self.decoder = GpuDecoder(workload.image_size, self.device)

    # ----------------------------------------------------------------- build
    def build_dataset(self) -> Any:
        """The workload's dataset, this rank's shard of it under DDP (its count checked: ``same_count``, ``same_dataset``)."""
        from autotune.workloads.data import same_count
        from autotune.workloads.same_task import same_dataset

        dataset = same_dataset(self.pipeline.dataset(), self.workload, self.rank.world_size)
        return self.rank.shard(same_count(dataset, self.workload, self.rank.world_size))

    def start_loader(self, dataset: Any) -> Any:
        """The loader's batches, endless as the emitted script streams epochs (an iterable dataset re-iterated);
        the workers of a map-style dataset time the batches they make (:attr:`clock`)."""
        from autotune.runner.shm_fit import checked_in_flight
        from autotune.workloads.pipeline import endless_batches
        from autotune.workloads.production import ProductionClock

        self.clock = ProductionClock(self.setup.num_workers) if self.setup.num_workers > 0 else None
        batches = endless_batches(self.setup, dataset, collate_fn=self.pipeline.collate_fn(), seed=self.options.seed,
                                  epochs=not hasattr(dataset, "__len__"), clock=self.clock)
        return checked_in_flight(batches, self.setup, self.rank.world_size)  # a queue larger than /dev/shm fails once it fills

    def build_model(self) -> None:
        """The model on the device with the setup's layout, DDP wrapper and compilation; its optimizer and grad scaler."""
        import torch

        from autotune.workloads.same_task import same_model

        built = self.pipeline.model()
        same_model(built, self.workload)
        kept = eval_modules(built)  # a frozen backbone's BatchNorm stays in eval mode, as the factory left it
        model = self.setup.prepare_model(built.to(self.device))
        train_mode(model, kept)
        wrapped = self.setup.wrap_ddp(model, self.device) if self.rank.distributed else model
        self.model = self.setup.compile_model(wrapped)
        self.optimizer = self.pipeline.optimizer(
            model.parameters(), lr=self.workload.lr, cuda=self.device_type == "cuda", impl=self.setup.optimizer_impl
        )
        self.scaler = self.setup.grad_scaler(self.device)
        self.bad = torch.zeros((), dtype=torch.bool, device=self.device)

    def to_device(self, batch: Any) -> Any:
        """The batch on the device (non-blocking from pinned memory), channels_last where the setup asks."""
        if self.decoder is not None:
            return self.decoder(batch, channels_last=self.setup.channels_last)
        return to_device(batch, self.device, channels_last=self.setup.channels_last)

    # ----------------------------------------------------------------- steps
    def micro_step(self, batch: Any, last: bool) -> None:
        """One forward and backward pass (the optimizer step when ``last``); the first of a compiled model compiles it."""
        if self.compile_s is None and self.setup.compile != "off":
            self.first_compiled_step(batch, last)
        else:
            self.eager_micro_step(batch, last)

    def first_compiled_step(self, batch: Any, last: bool) -> None:
        """The first micro-step of a compiled model: compilation happens here, timed as ``compile_s``.

        Raises:
            CompileFailed: torch.compile (dynamo or inductor) failed on the model.
        """
        start = time.perf_counter()
        try:
            self.eager_micro_step(batch, last)
            sync(self.device_type)
        except Exception as exc:
            if not type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
                raise
            reason = compile_reason(exc)  # with its explanation and the user's line, where dynamo gives them
            raise CompileFailed(f"torch.compile (mode {self.setup.compile}) failed: {type(exc).__name__}: {reason}{compile_fix(str(exc))}") from None
        self.compile_s = time.perf_counter() - start

    def eager_micro_step(self, batch: Any, last: bool) -> None:
        """One forward and backward pass; the optimizer step when ``last``."""
        import contextlib

        import torch

        # Gradients are reduced across ranks on the last micro-batch of a step only.
        quiet = self.model.no_sync() if self.rank.distributed and not last else contextlib.nullcontext()
        with quiet:
            with self.setup.autocast(self.device):
                loss = self.pipeline.loss(self.model, batch) / self.setup.accumulation_steps
            self.bad |= ~torch.isfinite(loss.detach())
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
        if last:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def check(self) -> None:
        """Raise on a broken memory budget or a non-finite loss."""
        if self.monitor.over_budget.is_set():
            raise BudgetExceeded(
                f"peak memory {format_bytes(self.monitor.peak_bytes)} exceeded the budget "
                f"of {format_bytes(self.options.max_memory_bytes or 0)}"
            )
        if self.options.max_memory_bytes is not None and self.device_type == "cuda":
            import torch

            peak = torch.cuda.max_memory_reserved(self.device)
            if peak > self.options.max_memory_bytes:
                raise BudgetExceeded(
                    f"peak reserved {format_bytes(peak)} exceeded the budget of {format_bytes(self.options.max_memory_bytes)}"
                )
        if self.bad is not None and bool(self.bad.item()):
            raise Diverged("the loss became NaN or infinite")

    def peak_memory(self) -> int:
        """Peak memory so far: the allocator's peak reserved on CUDA, on a CPU what the tree would hold alone (measure.tree_memory)."""
        if self.device_type == "cuda":
            import torch

            return int(torch.cuda.max_memory_reserved(self.device))
        return int(self.monitor.peak_bytes)

    def unit_for_mode(self) -> Work:
        """The unit of work of the mode and its warm-up."""
        setup = self.setup
        accum = setup.accumulation_steps
        mode = self.options.mode
        position = itertools.count()  # micro-batches measured: every accum-th ends an optimizer step
        if mode == "compute":
            self.build_model()
            batch = self.random_batch()
            batch_samples = self.pipeline.samples(batch)

            def compute_unit() -> int:
                self.micro_step(batch, next(position) % accum == accum - 1)
                return batch_samples

            def compute_warm() -> int:
                self.micro_step(batch, True)
                return batch_samples

            return Work(compute_unit, compute_warm, 3 if self.device_type == "cuda" else 1, accum)
        dataset = self.build_dataset()
        if mode == "loader":
            batches = self.start_loader(dataset)

            def loader_unit() -> int:
                with self.data_wait:
                    batch = next(batches)
                return self.pipeline.samples(batch)

            # The queue starts empty: the workers' first batches arrive together, then one more.
            return Work(loader_unit, loader_unit, setup.num_workers + 1)
        self.build_model()
        if setup.num_workers > 0:
            self.synthetic_step()
        batches = self.start_loader(dataset)

        def next_micro_step(last: bool) -> int:
            with self.data_wait:
                batch = next(batches)
            samples = self.pipeline.samples(batch)
            self.micro_step(self.to_device(batch), last)
            return samples

        def train_unit() -> int:
            return next_micro_step(next(position) % accum == accum - 1)

        def train_warm() -> int:
            return next_micro_step(True)

        return Work(train_unit, train_warm, self.warmup_steps(), accum)

    def synthetic_step(self) -> None:
        """One optimizer step on a random batch, before the loader starts.

        It carries the lazy initialisation so the workers' queue starts empty
        instead of filling while the first, slow step runs. Eager on a CPU,
        :data:`SYNTHETIC_CPU_BATCH` samples carry it (a full batch costs
        seconds); CUDA (cuDNN) and compiled models take the real shape.
        """
        full = self.device_type == "cuda" or self.setup.compile != "off"
        self.micro_step(self.random_batch(None if full else SYNTHETIC_CPU_BATCH), True)

    def random_batch(self, size: int | None = None) -> Any:
        """A batch of the real shape (or ``size`` samples) on the device: random images or the Task's items (spread over a
        map-style dataset; pixels: no GPU decoder)."""
        batch = self.pipeline.example_batch(min(size or self.setup.batch_size, self.setup.batch_size))
        return to_device(batch, self.device, channels_last=self.setup.channels_last)

    def warmup_steps(self) -> int:
        """Warm-up micro-steps of the train mode, each with an optimizer step.

        Warm-up counts micro-batches, not optimizer steps (the lazy
        initialisation is over after the first ones). With workers, the loader
        starts after :meth:`synthetic_step`, its queue empty; all workers
        deliver their first batch at about the same time, so ``num_workers``
        micro-steps pass before the loop runs at the rate the loader
        sustains. Without workers there is no queue and the first micro-step
        carries the lazy initialisation; on a CPU the next is already steady
        (``python -m benchmarks.warmup_steps``). CUDA adds two (cuDNN, allocator).
        """
        steps = max(1, self.setup.num_workers)
        return steps + 2 if self.device_type == "cuda" else steps

    # --------------------------------------------------------------- measure
    def run(self) -> TrialResult:
        """Warm up, measure the windows (each sent as a ``window`` event) and return the result.

        The value is the median window's samples/s, or with accumulation the
        samples over seconds across the whole steps. Every rank closes each
        window at the same micro-batch, timed by the slowest rank. Neither a
        window nor the value counts more than the loader's workers make
        (:meth:`loader_ceiling`, as the last window knew it).

        Raises:
            BudgetExceeded: Peak memory above the budget.
            Diverged: A non-finite loss.
        """
        work = self.work = self.work or self.unit_for_mode()
        unit = work.unit
        options = self.options
        # Warm-up (worker start-up, lazy init, cuDNN), capped so a slow step cannot eat the timeout.
        warm_start = time.perf_counter()
        warm_cap = max(5.0, 2.0 * options.trial_seconds)
        done = 0
        while done < work.warmup_steps:
            work.warmup_step()
            done += 1
            if self.monitor.over_budget.is_set():
                self.check()
            if done >= 2 and self.over(time.perf_counter() - warm_start > warm_cap):
                break
        sync(self.device_type)
        self.check()
        warmup_s = time.perf_counter() - self.started
        window_s = options.trial_seconds / options.windows
        rates: list[float] = []
        measured_s = 0.0
        total_samples = 0
        units = 0
        wait_before = self.data_wait.total_s
        import torch
        threads = torch.get_num_threads()
        load = LoadMeter(usable_cores(), os.getpgrp())  # the trial leads its own session: its ranks and workers are its tree
        ceiling, local_samples = None, 0
        for index in itertools.count():
            if not more_windows(index, measured_s, options):
                break
            start = time.perf_counter()
            samples = 0
            while True:
                samples += unit()
                units += 1
                if self.monitor.over_budget.is_set():
                    self.check()
                # Every rank decides alike: at the same micro-batch, by the slowest rank's time.
                if self.over(time.perf_counter() - start >= window_s) and may_close(
                    index, units, work.per_step, self.slowest(measured_s + time.perf_counter() - start), options
                ):
                    sync(self.device_type)
                    break
            elapsed = time.perf_counter() - start
            self.check()
            local_samples += samples
            ceiling = self.loader_ceiling(local_samples / units)  # this rank's samples per batch so far
            # The world's samples in the same window, timed by its slowest rank.
            samples = int(self.rank.reduce([samples], "sum")[0])
            # Data wait and peak memory so far of the worst rank: a pruned trial's record keeps them.
            elapsed, waited, peak = self.rank.reduce([elapsed, self.data_wait.total_s - wait_before, self.peak_memory()], "max")
            # No window counts more than the loader's workers make: a window inside a wave of their batches would.
            rate = samples / elapsed if ceiling is None else min(samples / elapsed, ceiling)
            rates.append(samples / elapsed)
            measured_s += elapsed
            total_samples += samples
            self.send({"event": "window", "index": index, "samples_per_s": rate, "seconds": elapsed, "wait_s": waited,
                       "peak_bytes": int(peak), "warmup_s": warmup_s, "threads": threads})
        # The workers' rate as the last window knew it, from the most batches, caps every window and the value.
        rates = [min(rate, ceiling) for rate in rates] if ceiling is not None else rates
        stats = summarize(rates)
        # Windows that close inside an optimizer step hold its cost unevenly: count time over the whole steps.
        figure = total_samples / measured_s if work.per_step > 1 else stats.median
        figure = min(figure, ceiling) if ceiling is not None else figure
        wait = self.data_wait.total_s - wait_before
        self.monitor.stop()
        self.check()
        # Data wait and peak memory of the worst rank.
        wait, peak = self.rank.reduce([wait, self.peak_memory()], "max")
        # One optimizer step (or loader batch) at the measured throughput.
        step_time = total_samples / max(units // work.per_step, 1) / figure
        return TrialResult(
            status="ok",
            samples_per_s=figure,
            samples_per_s_spread=stats.spread,
            step_time_s=step_time,
            data_wait_fraction=min(1.0, wait / measured_s) if measured_s > 0 else None,
            peak_memory_bytes=int(peak),
            warmup_s=warmup_s,
            measured_s=measured_s,
            error=None,
            windows=tuple(rates),
            samples=total_samples,
            mode=options.mode,
            compile_s=self.compile_s,
            num_threads=threads,
            other_cores=load.other_cores(),
            loader_samples_per_s=ceiling,
        )

    def loader_ceiling(self, samples_per_batch: float) -> float | None:
        """Samples/s the world's loader workers make at most: the slowest rank's times the ranks (``None``: not known,
        as without workers or for an iterable dataset; :class:`~autotune.workloads.production.ProductionClock`)."""
        made = self.clock.batches_per_s() if self.clock is not None else None
        slowest = -self.rank.reduce([-math.inf if made is None else -made * samples_per_batch], "max")[0]
        return None if math.isinf(slowest) else slowest * self.rank.world_size

    def slowest(self, seconds: float) -> float:
        """The largest of every rank's ``seconds`` (this rank's own when alone)."""
        return self.rank.reduce([seconds], "max")[0]

    def over(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank: every rank ends a window (or the warm-up) at the same step."""
        return self.rank.any(flag) if self.rank.distributed else flag
