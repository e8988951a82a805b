"""The examples: adopting a setup in your own loop, and a custom model factory."""

from __future__ import annotations

from pathlib import Path

import in_process
import pytest

import autotune
import autotune.output.best
from autotune.output.best import Best, write_best
from autotune.records import Workload
from autotune.train_setup import TrainSetup

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                *, code: int = 0) -> tuple[str, str]:
    """An example's ``main(argv)`` in this process (see :mod:`in_process`); its stdout and stderr."""
    returned, out, err = in_process.run_example(Path(args[0]), args[1:], cwd, capfd, monkeypatch)
    assert returned == code, f"exit {returned}\n{out}\n{err}"
    return out, err


def write_cpu_best(path: Path, setup: TrainSetup, reference: int = 256) -> None:
    workload = Workload(model="resnet18", image_size=32, device="cpu", num_classes=10, synthetic_images=64)
    write_best(
        path,
        Best(
            setup=setup,
            workload=workload,
            samples_per_s=100.0,
            samples_per_s_spread=1.0,
            defaults_samples_per_s=None,
            speedup=None,
            peak_memory_bytes=None,
            effective_batch=setup.effective_batch(),
            reference_batch=reference,
            lr=1e-3,
        ),
    )


def test_load_setup_reads_best_json(tmp_path: Path) -> None:
    setup = TrainSetup(num_workers=1, prefetch_factor=2, batch_size=8, accumulation_steps=2, amp="bf16")
    write_cpu_best(tmp_path / "best.json", setup)
    assert autotune.load_setup(tmp_path / "best.json") == setup
    # The whole file, public: the learning rate scaled for the tuned batch, which a loop of one's own trains with.
    best = autotune.load_best(tmp_path)
    assert isinstance(best, autotune.Best) and best.setup == setup and best.lr == 1e-3


def test_a_nested_batch_moves_as_the_trials_moved_it() -> None:
    """A Task's dict or nested batch in one's own loop: one call, as the trials did it (the README's loop moved x and y
    by hand, and only the internal batches.to_device did it for a dict)."""
    import torch

    setup = TrainSetup(channels_last=True)
    batch = {"image": torch.zeros(2, 3, 8, 8), "mask": torch.zeros(2, 8, 8, dtype=torch.long), "ids": ["a", "b"]}
    moved = setup.to_device(batch, "meta")
    assert {moved["image"].device.type, moved["mask"].device.type} == {"meta"} and moved["ids"] == ["a", "b"]
    assert moved["image"].is_contiguous(memory_format=torch.channels_last) and moved["mask"].is_contiguous()
    assert TrainSetup().to_device(batch, "meta")["image"].is_contiguous()
    # A device torch cannot name, or CUDA where there is none, is the helpers' one SetupError, not torch's RuntimeError.
    from autotune.errors import SetupError

    with pytest.raises(SetupError, match=r"^TrainSetup.to_device: unsupported device 'gpu'; use cpu, cuda or cuda:K$"):
        setup.to_device(batch, "gpu")
    if not torch.cuda.is_available():
        with pytest.raises(SetupError, match=r"^TrainSetup.to_device: device 'cuda': no CUDA GPU is usable here"):
            setup.to_device(batch, "cuda")


@pytest.mark.slow
def test_own_loop_with_inline_setup(tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = run_example([str(EXAMPLES / "own_loop.py")], tmp_path, capfd, monkeypatch)
    assert "setup: bs=16x2 w=0 bf16 channels_last" in out
    assert "step 3 loss" in out


@pytest.mark.slow
def test_own_loop_with_best_json(tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # fp32 (the inline setup above covers bf16): a loader worker, accumulation and a pinned thread count from the file.
    setup = TrainSetup(
        num_workers=1, prefetch_factor=2, persistent_workers=True, batch_size=8, accumulation_steps=2, num_threads=1
    )
    write_cpu_best(tmp_path / "best.json", setup)
    out, _ = run_example([str(EXAMPLES / "own_loop.py"), "best.json"], tmp_path, capfd, monkeypatch)
    assert f"setup: {setup.describe()}" in out
    assert "step 3 loss" in out


def test_own_loop_warms_the_rate_up_where_the_effective_batch_grew_more_than_4x(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """train.py warms the rate up over the first epoch where the tuned effective batch is over 4x the reference; the
    own-loop example did not, so a loop copied from it trained at the full scaled rate from its first step."""
    setup = TrainSetup(batch_size=8, accumulation_steps=2)  # 16, 8x the reference of 2
    write_cpu_best(tmp_path / "best.json", setup, reference=2)
    out, _ = run_example([str(EXAMPLES / "own_loop.py"), "best.json"], tmp_path, capfd, monkeypatch)
    rates = [float(line.rsplit(" lr ", 1)[1]) for line in out.splitlines() if line.startswith("step ")]
    full = 1e-3 * (16 / 2) ** 0.5  # the square-root rule from the reference's rate
    assert len(rates) >= 3 and rates == sorted(rates) and rates[0] < rates[-1] == pytest.approx(full, rel=1e-3), rates
    assert rates[0] == pytest.approx(full / len(rates), rel=1e-3)  # linear from 1/N of the rate, as train.py's warm-up
    write_cpu_best(tmp_path / "best.json", setup, reference=8)  # 2x the reference: no warm-up
    out, _ = run_example([str(EXAMPLES / "own_loop.py"), "best.json"], tmp_path, capfd, monkeypatch)
    assert {line.rsplit(" lr ", 1)[1] for line in out.splitlines() if line.startswith("step ")} == {"0.001414"}, out


def test_a_ddp_search_s_rate_is_scaled_to_the_processes_of_one_s_own_loop(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search of 2 processes wrote the rate for their effective batch (8 x 2 x 2 = 32); the own-loop example trained
    one process (an effective batch of 16) at it, without a word: sqrt(2) too high by the square-root rule."""
    import dataclasses
    import math

    from autotune.output.best import read_best, write_best

    setup = TrainSetup(batch_size=8, accumulation_steps=2)
    write_cpu_best(tmp_path / "best.json", setup)
    best = read_best(tmp_path / "best.json")
    ddp = dataclasses.replace(best, world_size=2, effective_batch=32, lr=1e-3 * math.sqrt(32 / 256))
    write_best(tmp_path / "best.json", ddp)
    loaded = autotune.load_best(tmp_path)
    assert loaded.lr_for(2) == pytest.approx(loaded.lr) and loaded.lr_for(1) == pytest.approx(1e-3 * math.sqrt(16 / 256))
    linear = dataclasses.replace(loaded, workload=dataclasses.replace(loaded.workload, lr_scaling="linear"))
    assert linear.lr_for(4) == pytest.approx(1e-3 * 64 / 256)
    with pytest.raises(autotune.AutotuneError, match="world_size must be a whole number >= 1, got 0"):
        loaded.lr_for(0)
    out, _ = run_example([str(EXAMPLES / "own_loop.py"), "best.json"], tmp_path, capfd, monkeypatch)
    assert "note: tuned with 2 processes (lr 0.000353553); one process here trains an effective batch of 16 at lr 0.00025" in out


@pytest.mark.slow
def test_own_loop_rejects_a_setup_the_device_cannot_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    write_cpu_best(tmp_path / "best.json", TrainSetup(batch_size=8, amp="fp16"))
    _, err = run_example([str(EXAMPLES / "own_loop.py"), "best.json"], tmp_path, capfd, monkeypatch, code=2)
    assert "fp16 needs a CUDA device" in err and "Traceback" not in err
    _, err = run_example([str(EXAMPLES / "own_loop.py"), "nowhere"], tmp_path, capfd, monkeypatch, code=2)
    assert err.strip() == "error: nowhere: no such file (run `autotune search` first)", err  # a 10-line traceback before


@pytest.mark.slow
def test_custom_model_example(tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    out, _ = run_example([str(EXAMPLES / "custom_model.py"), str(work)], tmp_path, capfd, monkeypatch)
    assert "winner: " in out
    assert "train.py --max-steps 2" in out
    assert "model tiny_net:tiny_net" in out  # printed by the emitted script, run as its own process
    assert "step 2 loss" in out
    best = autotune.output.best.read_best(work / "out" / "best.json")
    assert best.workload.model == "tiny_net:tiny_net" and best.samples_per_s > 0
    assert (work / "out" / "train.py").is_file()
    assert (work / "train-out" / "checkpoint.pth").is_file()


def test_docs_own_loop_snippet_runs(tmp_path: Path) -> None:
    """The fourteen-line loop in docs/emit.md runs as written (on the CPU), and README.md shows the same."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    text = (Path(__file__).resolve().parents[1] / "docs" / "emit.md").read_text(encoding="utf-8")
    section = text[text.index("## Using the setup in your own loop"):]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 14
    assert code in (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    setup = TrainSetup(batch_size=4, accumulation_steps=2, amp="bf16", channels_last=True, optimizer_impl="for-loop")
    write_cpu_best(tmp_path / "best.json", setup)
    code = code.replace('"autotune-out/best.json"', repr(str(tmp_path / "best.json")))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    before = [p.detach().clone() for p in model.parameters()]
    dataset = TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,)))
    namespace = {
        "autotune": autotune, "torch": torch, "dataset": dataset, "model": model,
        "criterion": nn.CrossEntropyLoss(), "device": "cpu",
    }
    exec(compile(code, "docs/emit.md", "exec"), namespace)
    assert namespace["i"] == 3  # 16 samples / batch 4 = 4 micro-batches = 2 optimizer steps
    assert namespace["optimizer"].defaults["foreach"] is False  # the tuned kernels
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_task_s_own_loop_takes_what_train_py_calls_from_the_task() -> None:
    """docs/workloads.md's own loop for a Task: `task.loss(model(x), y)` failed on a Task with the default loss (None
    there) and the docs named no other way; build_model, the collate_fn, compute_loss and samples_in are what train.py
    calls, and they train."""
    import torch
    from torch import nn

    def pad(items):  # variable-length rows padded to the longest, their lengths counted as samples
        rows = nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
        return rows[:, :4], torch.tensor([y for _, y in items])

    items = [(torch.randn(3 + i % 3), i % 2) for i in range(8)]
    task = autotune.Task(lambda: nn.Linear(4, 2), items, collate_fn=pad, batch_size_of=lambda batch: len(batch[1]))
    assert task.loss is None  # the default loss: task.loss(model(x), y) cannot work
    setup = TrainSetup(batch_size=4)
    model = task.build_model()
    loader = setup.dataloader(task.dataset, shuffle=True, collate_fn=task.collate_fn)
    optimizer = setup.optimizer(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    seen = 0
    for batch in loader:
        loss = task.compute_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seen += task.samples_in(batch)
    assert seen == 8 and loss.dim() == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
