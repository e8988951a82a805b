"""The workload examples tuned end to end (tiny, CPU, real trials), and their emitted train.py run for two steps."""

from __future__ import annotations

import atexit
import runpy
from pathlib import Path

import pytest

import autotune
from autotune.api_results import in_api_words

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("example", ["text_classifier", "segmentation", "csv_images"])
def test_example_is_tuned_and_its_train_py_runs_the_workload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], example: str
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = autotune.search(
        workload=f"{example}:make_task", trials=2, device="cpu", trial_seconds=1.0, confirm_top=1, confirm_rounds=1,
        ceilings=False, out=tmp_path / "out", progress=example == "segmentation",  # ceilings: covered by test_search.py
    )
    assert result.setup is not None and result.samples_per_s and result.samples_per_s > 0
    # What qualifies the figures, as the CLI's note: lines; progress=True prints them too (the API showed none).
    assert result.notes == tuple(map(in_api_words, result.outcome.best.notes)) and result.notes  # "confirmation: 1 interleaved round"
    assert result.verdict == in_api_words(result.outcome.verdict)  # "--set num_workers=0 searches that side", say
    printed = capsys.readouterr().err
    assert all((f"note: {note}" in printed) is (example == "segmentation") for note in result.notes), printed  # unwrapped
    if example == "segmentation":  # the progress lines in the API's words too ("--set compile=default compiles every trial")
        assert 'constraints=["compile=default"]' in printed and "--set " not in printed, printed
    assert result.best_json.exists() and result.outcome.best is not None
    # Absolute paths (found after a notebook's %cd) and a repr a notebook's cell can show: not every trial.
    assert result.best_json == tmp_path / "out" / "best.json" and result.train_py.is_absolute()
    assert "outcome=" not in repr(result) and len(repr(result)) < 3000, len(repr(result))
    assert result.outcome.best.command.startswith(f"python: autotune.search(workload='{example}:make_task', trials=2, device='cpu', ")
    assert result.outcome.best.workload.task == f"{example}:make_task"
    if example == "text_classifier":
        assert not result.setup.channels_last and result.outcome.best.workload.image_input is False
    # The emitted script imports the same factory (run in this process: torch is already imported).
    script = runpy.run_path(str(result.train_py), run_name="emitted_train")
    monkeypatch.chdir(tmp_path)
    exits: list[tuple[object, tuple[object, ...]]] = []  # run when main() ends, as the process would at its exit
    monkeypatch.setattr(atexit, "register", lambda func, *args: exits.append((func, args)))
    script["main"](script["get_args_parser"]().parse_args(["--max-steps", "2", "--print-freq", "1", "--output-dir", "train-out"]))
    for func, args in reversed(exits):
        func(*args)  # type: ignore[operator]
    printed = capsys.readouterr().out
    assert f"workload {example}:make_task" in printed and "step 2 loss" in printed
    assert (tmp_path / "train-out" / "checkpoint.pth").exists()


@pytest.mark.slow
def test_a_dataset_that_fails_only_in_loader_workers_is_reported_as_such() -> None:
    outcome = autotune.trial(
        workload="task_factories:fails_in_workers", device="cpu", trial_seconds=1.0,
        setup=autotune.TrainSetup(num_workers=1, prefetch_factor=2, persistent_workers=True, batch_size=8),
    )
    assert outcome.status == "error"
    assert outcome.result.error is not None and outcome.result.error.startswith("failed in a DataLoader worker")
    assert "database connection" in outcome.result.error


@pytest.mark.slow
def test_an_item_that_raises_in_a_batch_is_bad_data_and_stops_the_search_naming_it(tmp_path: Path) -> None:
    """The memory pre-pass reads real items: the one that raises is the data's fault, not a memory limit of the batch."""
    from autotune.errors import WorkloadError
    from autotune.records import TrialOptions
    from autotune.runner import run_trial
    from autotune.workloads.tasks import build_task_workload

    workload = build_task_workload("task_factories:corrupt_record", device="cpu", workers=False)
    result = run_trial(autotune.TrainSetup(batch_size=256), workload, TrialOptions(trial_seconds=1.0, mode="compute"))
    assert (result.status, result.error) == ("bad_data", "dataset[250] failed: ValueError: corrupt record 250")  # its first line
    subset = build_task_workload("task_factories:corrupt_record_subset", device="cpu", workers=False)  # read by __getitems__
    result = run_trial(autotune.TrainSetup(batch_size=256), subset, TrialOptions(trial_seconds=1.0, mode="compute"))
    assert (result.status, result.error) == ("bad_data", "dataset[250] failed: ValueError: corrupt record 250")
    # The loader's batches in the trial's own process name it too: whichever run meets it first (the pre-pass reaches
    # item 250 only when the machine is fast enough for batch 256, else the calibration's loader run), the search says
    # the same. In a worker it stays the setup's error: a dataset may fail only there (test above).
    setup = autotune.TrainSetup(batch_size=300)  # one batch holds every item
    loaded = run_trial(setup, workload, TrialOptions(trial_seconds=1.0, mode="loader"))
    assert (loaded.status, loaded.error) == ("bad_data", "dataset[250] failed: ValueError: corrupt record 250")
    in_worker = run_trial(setup.replace(num_workers=1), workload, TrialOptions(trial_seconds=1.0, mode="loader"))
    assert in_worker.status == "error" and "failed in a DataLoader worker" in (in_worker.error or ""), in_worker
    short = build_task_workload("task_factories:record_out_of_memory", device="cpu", workers=False)
    assert run_trial(autotune.TrainSetup(batch_size=256), short, TrialOptions(trial_seconds=1.0, mode="compute")).status == "oom"
    from autotune.tuner.progress import SilentReporter

    messages: list[str] = []
    reporter = SilentReporter()
    reporter.message = messages.append  # type: ignore[method-assign]
    with pytest.raises(WorkloadError, match=r"^bad data: dataset\[250\] failed: ValueError: corrupt record 250; fix or replace it in place"):
        autotune.search(workload="task_factories:corrupt_record", trials=2, device="cpu", trial_seconds=1.0,
                        out=tmp_path / "out", reporter=reporter)
    # The pre-pass's batches spread over the 300 items: batch 8 misses item 250, batch 32 reads it (pipeline.spread_indices).
    assert any("memory pre-pass: batch 8: ok" in m for m in messages) and not any("verify" in m for m in messages), messages
    assert not any("batch 32: ok" in m for m in messages), messages


@pytest.mark.parametrize("factory", ["calls_backward", "calls_backward_retaining"])
def test_a_step_that_calls_backward_itself_is_told_to_return_the_loss_only(factory: str) -> None:
    """Refused before any trial. With retain_graph=True the trial's own backward raised nothing: every trial and
    train.py trained on doubled gradients, without the scaler or accumulation, and measured two backward passes."""
    from autotune.errors import WorkloadError
    from autotune.runner.failures import classify

    with pytest.raises(WorkloadError, match=r"^step\(model, batch\) computed the gradients itself \(the model's .grad changed when it "
                                            r"returned: it called backward\(\)\); it must return the loss only"):
        autotune.trial(workload=f"task_factories:{factory}", device="cpu", trial_seconds=1.0, setup=autotune.TrainSetup(batch_size=8))
    import torch
    from torch import nn

    from autotune.workloads.tasks import check_task

    def adversarial(model, batch):  # backward for the input's gradient, then the parameters' zeroed in place
        inputs = batch[0].clone().requires_grad_(True)
        nn.functional.cross_entropy(model(inputs), batch[1]).backward()
        model.zero_grad(set_to_none=False)
        return nn.functional.cross_entropy(model(inputs.detach() + 0.01 * inputs.grad.sign()), batch[1])

    def input_gradient(model, batch):  # torch.autograd.grad sets no .grad
        inputs = batch[0].clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(model(inputs), batch[1])
        (grad,) = torch.autograd.grad(loss, inputs, create_graph=True)
        return loss + grad.pow(2).sum()

    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    for step in (adversarial, input_gradient):
        model = nn.Linear(4, 3)
        model.weight.grad = torch.ones_like(model.weight)  # a caller's own gradients: compared, kept
        check_task(autotune.Task(model, data, step=step), workers=False)
        assert model.weight.grad is not None
    # A step that calls it only in some steps gets past the check: the trial's error says what to change.
    error = classify(RuntimeError("Trying to backward through the graph a second time (or directly access saved tensors)")).error
    assert error is not None and error.endswith("does the workload's step(model, batch) call backward()? It must return the loss "
                                                "only: the trial (and train.py) call backward, with the gradient scaler and accumulation")


def test_the_api_s_notes_name_its_keywords_not_the_cli_s_flags() -> None:
    """A notebook user was told to "pass --effective-batch 32", a flag autotune.search() has no way to take. Only a
    flag with a value is rewritten: a flag the prose names ("a search without --devices measures ...") stays."""
    assert in_api_words("...; pass --effective-batch 32 to keep the math") == "...; pass effective_batch=32 to keep the math"
    assert in_api_words("to keep the math, pass --effective-batch 32 with a --set batch_size that divides it (--set batch_size=64 "
                        "allows none)") == ('to keep the math, pass effective_batch=32 with a --set batch_size that divides it '
                                            '(constraints=["batch_size=64"] allows none)')
    assert in_api_words("re-run with --data DIR to tune on your own images") == "re-run with data=DIR to tune on your own images"
    assert in_api_words("(a search without --devices measures that run)") == "(a search without --devices measures that run)"
    assert in_api_words("tuned with --lr 1e-4.") == "tuned with lr=1e-4."  # a number, not the string "1e-4."
    assert in_api_words("--storage sqlite:///x/study.db holds it") == 'storage="sqlite:///x/study.db" holds it'
    assert in_api_words("train.py --max-steps 3") == "train.py --max-steps 3"  # the script's flags stay
    assert in_api_words("--set amp=fp16: needs CUDA; --set amp=off,bf16.") == 'constraints=["amp=fp16"]: needs CUDA; constraints=["amp=off,bf16"].'
    assert in_api_words("best so far (unconfirmed); rerun the same command to resume") == "best so far (unconfirmed); rerun the same call to resume"
