"""The torch knobs: num_threads, compile, cudnn_benchmark, tf32, optimizer_impl, decode.

Validation, where each is offered, ``--set``, best.json, the trial process
(real tiny trials) and the emitted train.py. CUDA paths are in test_cuda.py.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.devices import DeviceInfo
from autotune.errors import SetupError, UsageError
from autotune.output.best import read_best, write_best
from autotune.output.compile_payoff import compile_section, payoff_note, payoffs
from autotune.records import Calibration, MemoryPoint, TrialOptions, TrialRecord, TrialResult, Workload
from autotune.runner import run_trial
from autotune.runner.entry import execute
from autotune.train_setup import KNOBS, TrainSetup, load_setup
from autotune.tuner.constraints import merge_constraints, parse_constraint, pinned_values
from autotune.tuner.refine import MIN_TRIALS, ROLE_COMPILE
from autotune.tuner.space import build_space
from autotune.workloads.collation import same_shapes

CPU = DeviceInfo("cpu", True, None, None, "Test CPU")
A100 = DeviceInfo("cuda:0", True, 80 * 2**30, 80 * 2**30, "A100", tf32=True)
T4 = DeviceInfo("cuda:0", False, 16 * 2**30, 16 * 2**30, "T4", tf32=False)
NEW = ("num_threads", "compile", "cudnn_benchmark", "tf32", "optimizer_impl", "decode")
QUICK = TrialOptions(trial_seconds=0.5, windows=2)


def calibration() -> Calibration:
    return Calibration(
        budget_bytes=2**33, max_batch=64, memory_points=(MemoryPoint(64, "ok", 2**28, 100.0),), probe_batch=64,
        compute_setup=TrainSetup(), compute_samples_per_s=None, loader=(), max_workers=2,
    )


def space_for(device: DeviceInfo, workload: Workload | None = None, *sets: str) -> Any:
    constraints = merge_constraints(parse_constraint(s) for s in sets)
    return build_space(device=device, calibration=calibration(), usable_cores=2, effective_batch=None,
                       constraints=constraints, workload=workload)


# ------------------------------------------------------------- TrainSetup
def test_defaults_are_pytorch_out_of_the_box_and_round_trip() -> None:
    setup = TrainSetup()
    assert [getattr(setup, k) for k in NEW] == [None, "off", False, False, None, "cpu"]
    assert set(NEW) <= set(KNOBS)
    tuned = TrainSetup(num_threads=1, compile="default", optimizer_impl="fused", cudnn_benchmark=True, tf32=True, decode="gpu")
    assert TrainSetup.from_json(tuned.to_json()) == tuned
    assert "threads=1" in tuned.describe() and "compile=default" in tuned.describe()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_threads": 0}, "num_threads must be an integer >= 1"),
        ({"num_threads": True}, "num_threads"),
        ({"compile": "fast"}, "compile must be one of off, default"),
        ({"optimizer_impl": "vectorized"}, "optimizer_impl must be one of null, for-loop, foreach, fused"),
        ({"decode": "npu"}, "decode must be one of cpu, gpu"),
        ({"tf32": "yes"}, "tf32 must be true or false"),
    ],
)
def test_bad_values_are_one_line_errors(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(SetupError, match=match) as info:
        TrainSetup(**changes)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"cudnn_benchmark": True}, "cudnn_benchmark needs a CUDA device"),
        ({"tf32": True}, "tf32 needs a CUDA device"),
        ({"decode": "gpu"}, "decode=gpu needs a CUDA device"),
        ({"compile": "reduce-overhead"}, "reduce-overhead uses CUDA graphs"),
    ],
)
def test_cuda_only_knobs_are_refused_on_a_cpu(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(SetupError, match=match):
        TrainSetup(**changes).check_device("cpu")
    TrainSetup(optimizer_impl="fused", compile="default", num_threads=1).check_device("cpu")  # these run on a CPU
    with pytest.raises(SetupError, match="TF32 tensor cores"):
        TrainSetup(tf32=True).check_device("cuda:0", tf32_supported=False)


def test_old_best_json_without_the_new_knobs_loads_with_defaults(tmp_path: Path) -> None:
    old = {"num_workers": 2, "prefetch_factor": 4, "pin_memory": False, "persistent_workers": True,
           "batch_size": 64, "accumulation_steps": 1, "amp": "bf16", "channels_last": True}
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"schema": 1, "setup": old}))
    setup = load_setup(path)
    assert setup == TrainSetup(**old) and setup.compile == "off" and setup.num_threads is None


def test_best_json_round_trips_the_new_knobs(tmp_path: Path, synthetic_data: Path) -> None:
    from test_emit import make_best

    best = make_best(synthetic_data, num_threads=1, compile="default", optimizer_impl="foreach")
    write_best(tmp_path / "best.json", best)
    assert read_best(tmp_path).setup == best.setup
    assert load_setup(tmp_path / "best.json").optimizer_impl == "foreach"


def test_helpers_apply_the_knobs_in_this_process() -> None:
    before = torch.get_num_threads()
    try:
        TrainSetup(num_threads=1).configure_torch("cpu")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    model = torch.nn.Linear(4, 2)
    assert TrainSetup(optimizer_impl="fused").optimizer(model.parameters(), lr=0.1).defaults["fused"] is True
    assert TrainSetup(optimizer_impl="for-loop").optimizer(model.parameters(), lr=0.1).defaults["foreach"] is False
    sgd = TrainSetup(optimizer_impl="foreach").optimizer(model.parameters(), lr=0.1, cls=torch.optim.SGD)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["foreach"] is True
    assert TrainSetup().compile_model(model) is model


def test_gpu_decode_batches_count_images_not_bytes(tiny_workload: Workload) -> None:
    """decode=gpu batches hold files' bytes: a trial counts their labels. The decoder runs on any
    device decode_jpeg supports, so its path is exercised here on the CPU."""
    from autotune.workloads.gpu_decode import GpuDecoder
    from autotune.workloads.pipeline import ClassifierPipeline

    pipeline = ClassifierPipeline(tiny_workload, decode="gpu")
    dataset = pipeline.dataset()
    collate = pipeline.collate_fn()
    assert collate is not None
    batch = collate([dataset[i] for i in range(4)])
    assert pipeline.samples(batch) == 4  # not the first file's length in bytes
    images, labels = GpuDecoder(32, "cpu")(batch, channels_last=True)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert pipeline.samples((images, labels)) == 4


def test_gpu_decode_reads_every_format_image_folder_reads(tmp_path: Path, synthetic_data: Path) -> None:
    """decode=gpu decodes a file that is not a JPEG on the CPU: torchvision's decoder refuses BMP, TIFF, PPM and 16-bit
    PNG (a probe's folder crashed a decode=gpu batch with "Unsupported image file" or "Promotion for uint16"), which
    ImageFolder and the CPU pipeline read through PIL; so do both decoders now (the trial's and train.py's)."""
    import numpy as np
    from PIL import Image
    from test_emit import load_script, make_best, write_script

    from autotune.workloads.gpu_decode import GpuDecoder, byte_folder, collate_bytes

    (tmp_path / "a").mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "a" / "0.jpg", quality=90)
    for name in ("1.bmp", "2.tif", "3.ppm"):
        Image.new("RGB", (40, 30), (10, 200, 10)).save(tmp_path / "a" / name)
    Image.fromarray(np.full((30, 40), 40000, dtype=np.uint16)).save(tmp_path / "a" / "4.png")  # 16-bit grayscale
    dataset = byte_folder(str(tmp_path))
    files, labels, paths = collate_bytes([dataset[i] for i in range(len(dataset))])
    assert paths == [path for path, _ in dataset.samples]
    images, _ = GpuDecoder(16, "cpu")((files, labels, paths))
    assert images.shape == (5, 3, 16, 16) and torch.isfinite(images).all()
    script = load_script(write_script(make_best(synthetic_data, **{"decode": "cpu"}), tmp_path / "train.py"))
    for data in files[1:]:
        decoded = script["decode_on_cpu"](data)
        assert decoded.dtype == torch.uint8 and decoded.shape == (3, 30, 40)


def test_a_file_neither_gpu_decode_fallback_reads_is_a_bad_image_named_by_both_decoders(tmp_path: Path, synthetic_data: Path) -> None:
    """decode=gpu: an empty file or one that is no image among the JPEGs ended the emitted train.py in a traceback
    (PIL's UnidentifiedImageError) and a trial as a setup's error naming no file; the CPU pipeline names it as bad data.
    The decoders run on the CPU here (decode_jpeg takes device="cpu"), their fallback as on the GPU."""
    from PIL import Image
    from test_emit import load_script, make_best, write_script

    from autotune.workloads.data import BadImage
    from autotune.workloads.gpu_decode import GpuDecoder, byte_folder, collate_bytes

    (tmp_path / "a").mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "a" / "0.jpg", quality=90)
    (tmp_path / "a" / "1.jpg").write_bytes(b"")
    (tmp_path / "a" / "2.jpg").write_bytes(b"not an image at all")
    dataset = byte_folder(str(tmp_path))
    script = load_script(write_script(make_best(synthetic_data, **{"decode": "cpu"}), tmp_path / "train.py"))
    script_folder = script["torchvision"].datasets.ImageFolder(str(tmp_path), loader=script["read_named"])
    for name, index in (("1.jpg", 1), ("2.jpg", 2)):
        with pytest.raises(BadImage, match=rf"^{tmp_path}/a/{name}: cannot decode \(UnidentifiedImageError: "):
            GpuDecoder(16, "cpu")(collate_bytes([dataset[0], dataset[index]]))
        named, labels = script["collate_bytes"]([script_folder[0], script_folder[index]])
        with pytest.raises(script["BadImage"], match=rf"^bad image {tmp_path}/a/{name}: UnidentifiedImageError: "):
            script["GpuDecode"](16, torch.device("cpu"))(named, labels)
    (tmp_path / "a" / "0.jpg").unlink()  # removed after the folder was read: named, not FileNotFoundError's traceback
    with pytest.raises(script["BadImage"], match=rf"^bad image {tmp_path}/a/0.jpg: cannot read \(No such file or directory\)"):
        script["read_bytes"](str(tmp_path / "a" / "0.jpg"))


def test_16_bit_grayscale_is_scaled_to_8_bits_not_clipped_by_every_loader(tmp_path: Path, synthetic_data: Path) -> None:
    """PIL's RGB conversion, which torchvision's ImageFolder loader uses, clips a 16-bit value above 255 to 255: a 16-bit
    scan (40000 of 65535 everywhere) trained as a white image in the search, the trial and train.py alike. Every loader
    now scales it (40000 / 256 = 156): the CPU pipeline's, the --decode gpu fallback's, and the script's two."""
    import numpy as np
    from PIL import Image
    from test_emit import load_script, make_best, write_script

    from autotune.workloads.data import load_image
    from autotune.workloads.gpu_decode import decode_on_cpu, read_bytes

    for name in ("scan.png", "scan.tif"):  # torchvision decodes the PNG (to uint16), PIL the TIFF
        Image.fromarray(np.full((30, 40), 40000, dtype=np.uint16)).save(tmp_path / name)
    script = load_script(write_script(make_best(synthetic_data, **{"decode": "cpu"}), tmp_path / "train.py"))
    for name in ("scan.png", "scan.tif"):
        path = str(tmp_path / name)
        assert Image.open(path).mode == "I;16" and set(np.asarray(Image.open(path).convert("RGB")).flat) == {255}  # PIL's
        for image in (load_image(path), script["load_rgb"](path)):
            assert image.mode == "RGB" and set(np.asarray(image).flat) == {156}, name
        for decode in (decode_on_cpu, script["decode_on_cpu"]):
            decoded = decode(read_bytes(path))
            assert decoded.dtype == torch.uint8 and set(decoded.flatten().tolist()) == {156}, name
    older = Image.fromarray(np.full((3, 4), 40000, dtype=np.int32), mode="I")  # as Pillow < 10.3 opens a 16-bit PNG
    older.format = "PNG"
    script_rgb = script["load_rgb"].__globals__["rgb"]
    from autotune.workloads.data import rgb

    for convert in (rgb, script_rgb):
        assert set(np.asarray(convert(older)).flat) == {156}
    # 32-bit TIFFs (microscopy): integers read white and 0..1 floats black through PIL's conversion; scaled alike.
    Image.fromarray(np.full((30, 40), 40000, dtype=np.int32), mode="I").save(tmp_path / "wide.tif")
    Image.fromarray(np.full((30, 40), 0.5, dtype=np.float32), mode="F").save(tmp_path / "float.tif")
    # 8-bit values held in 32 bits (a NumPy export) read as they are, as PIL reads them.
    Image.fromarray(np.full((30, 40), 128, dtype=np.int32), mode="I").save(tmp_path / "narrow.tif")
    Image.fromarray(np.full((30, 40), 128.0, dtype=np.float32), mode="F").save(tmp_path / "bytes.tif")
    for name, value in (("wide.tif", 156), ("float.tif", 127), ("narrow.tif", 128), ("bytes.tif", 128)):
        path = str(tmp_path / name)
        assert set(np.asarray(Image.open(path).convert("RGB")).flat) == {255 if value == 156 else 0 if value == 127 else 128}
        for image in (load_image(path), script["load_rgb"](path)):
            assert image.mode == "RGB" and set(np.asarray(image).flat) == {value}, name
        for decode in (decode_on_cpu, script["decode_on_cpu"]):
            assert set(decode(read_bytes(path)).flatten().tolist()) == {value}, name
    Image.new("RGB", (4, 4), (200, 10, 10)).save(tmp_path / "colour.png")  # 8-bit images are read as before
    assert np.asarray(load_image(str(tmp_path / "colour.png")))[0, 0].tolist() == [200, 10, 10]


def test_decode_gpu_workers_read_bytes_in_plain_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """decode=gpu's loader workers (trials' and train.py's) read each file's exact bytes without torchvision's
    read_file, which never returned in a worker forked after CUDA started (an H200, docs/benchmarks.md)."""
    import torchvision.io
    from torch.utils.data import DataLoader

    from autotune.workloads.gpu_decode import byte_folder, collate_bytes, read_bytes

    def hangs(path: str) -> Any:
        raise AssertionError("torchvision.io.read_file called in a loader worker")

    monkeypatch.setattr(torchvision.io, "read_file", hangs)
    (tmp_path / "a").mkdir()
    files = {"x.jpg": bytes(range(256)) * 3, "y.jpg": b"\xff\xd8tail", "z.jpg": b""}
    for name, data in files.items():
        (tmp_path / "a" / name).write_bytes(data)
    script_read = _template_function("train.py.tmpl", "read_bytes")["read_bytes"]
    for reader in (read_bytes, script_read):
        assert [bytes(reader(str(tmp_path / "a" / name)).numpy()) for name in files] == list(files.values())
        assert reader(str(tmp_path / "a" / "z.jpg")).dtype == torch.uint8
    loader = DataLoader(byte_folder(str(tmp_path)), batch_size=3, num_workers=2, collate_fn=collate_bytes,
                        multiprocessing_context="fork")
    (batch, labels, paths), = list(loader)
    assert [bytes(t.numpy()) for t in batch] == list(files.values()) and labels.tolist() == [0, 0, 0]
    import os

    from autotune.workloads.data import BadImage

    os.mkfifo(tmp_path / "a" / "fifo.jpg")  # open() would wait for a writer: refused by name, as the CPU pipeline does
    with pytest.raises(BadImage, match=r"fifo.jpg: not a regular file"):
        read_bytes(str(tmp_path / "a" / "fifo.jpg"))
    with pytest.raises(BadImage, match=r"gone.jpg: cannot read \(No such file or directory\)"):
        read_bytes(str(tmp_path / "a" / "gone.jpg"))


def test_the_random_batch_is_pixels_and_skips_the_gpu_decoder(tiny_workload: Workload) -> None:
    """The synthetic step and the compute-only mode feed random pixels, which the decoder of files must not see."""
    from autotune.runner.child import TrialLoop

    loop = TrialLoop(TrainSetup(batch_size=4, channels_last=True), tiny_workload, TrialOptions(),
                     started=time.perf_counter(), send=lambda event: None)

    def decoder(batch: Any, *, channels_last: bool = False) -> Any:
        raise AssertionError("random pixels went through the decoder of files' bytes")

    loop.decoder = decoder  # what decode=gpu installs
    images, labels = loop.random_batch(2)
    assert images.shape == (2, 3, 32, 32) and images.is_contiguous(memory_format=torch.channels_last)
    assert labels.shape == (2,)
    loop.monitor.stop()


def _template_function(template: str, name: str, *more: str) -> dict[str, Any]:
    """A namespace holding top-level functions of an emitted script's template (with the shared code in place)."""
    import re

    import autotune.output.emit

    source = autotune.output.emit._template(template).template
    functions = [re.search(rf"^def {each}\(.*\):\n(?:    .*\n|\n)+?(?=\n\ndef )", source, re.M) for each in (name, *more)]
    assert None not in functions
    import math
    import os
    import stat

    namespace: dict[str, Any] = {"torch": torch, "sys": sys, "os": os, "stat": stat, "math": math,
                                 "BadImage": type("BadImage", (Exception,), {})}
    for function in functions:
        exec(function.group(0), namespace)  # type: ignore[union-attr]
    return namespace


@pytest.mark.parametrize("template", ["train.py.tmpl", "train_task.py.tmpl"])
def test_tf32_leaves_the_matmul_precision_readable(template: str) -> None:
    """TF32 on, the matmul precision still reads back: inductor's autotuning calls
    torch.get_float32_matmul_precision(), which raises once matmul.fp32_precision was set.
    The flags need no GPU to be set, so this runs on the CPU, for the trials' helper and both scripts."""
    import argparse

    namespace = _template_function(template, "configure_torch")
    args = argparse.Namespace(threads=None, cudnn_benchmark=False, tf32=True, compile="off", decode="cpu")
    from autotune.torch_knobs import configure_torch  # what TrainSetup.configure_torch applies once the device is checked

    appliers = [lambda: configure_torch("cuda:0", num_threads=None, cudnn_benchmark=False, tf32=True),
                lambda: namespace["configure_torch"](args, torch.device("cuda", 0))]
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.conv.fp32_precision)
    for apply in appliers:
        try:
            apply()
            assert torch.get_float32_matmul_precision() == "high"
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        finally:
            torch.set_float32_matmul_precision(before[0])
            torch.backends.cudnn.conv.fp32_precision = before[1]


@pytest.mark.parametrize("template", ["train.py.tmpl", "train_task.py.tmpl"])
def test_off_flags_undo_what_the_training_module_turned_on(template: str) -> None:
    """A module that turns TF32 and cuDNN autotuning on at import (it runs before the flags are
    applied) does not keep them on in a tf32=false, cudnn_benchmark=false trial or script run."""
    import argparse

    from autotune.torch_knobs import configure_torch

    namespace = _template_function(template, "configure_torch")
    args = argparse.Namespace(threads=None, cudnn_benchmark=False, tf32=False, compile="off", decode="cpu")
    appliers = [lambda: configure_torch("cuda:0", num_threads=None, cudnn_benchmark=False, tf32=False),
                lambda: namespace["configure_torch"](args, torch.device("cuda", 0))]
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)
    for apply in appliers:
        try:
            torch.backends.cuda.matmul.allow_tf32 = True  # what the module did
            torch.backends.cudnn.benchmark = True
            apply()
            assert torch.get_float32_matmul_precision() == "highest"
            assert torch.backends.cuda.matmul.allow_tf32 is False
            assert torch.backends.cudnn.benchmark is False
        finally:
            torch.set_float32_matmul_precision(before[0])
            torch.backends.cudnn.benchmark = before[1]


# ------------------------------------------------------- space and --set
def test_cpu_space_offers_threads_kernels_and_eager_sampling() -> None:
    space = space_for(CPU)
    values = space.values
    # torch's own choice (no set_num_threads call) first, then every count: a choice, not a range.
    assert values["num_threads"] == (None, 1, 2) and not space.is_range("num_threads")
    assert "num_threads=auto|1|2" in space.describe()
    assert values["optimizer_impl"] == ("for-loop", "foreach", "fused")  # fused AdamW runs on a CPU in torch 2.14
    assert values["compile"] == ("off", "default") and space.compile_modes() == ("default",)
    assert values["cudnn_benchmark"] == (False,) and values["tf32"] == (False,) and values["decode"] == ("cpu",)
    import optuna

    trial = optuna.create_study().ask()
    setup = space.suggest(trial)
    assert setup.compile == "off" and "compile" not in trial.params  # compile is a refinement, not sampled
    assert setup.num_threads in (None, 1, 2) and space.contains(setup) and space.contains(TrainSetup())


def test_gpu_space_offers_cudnn_tf32_and_gpu_decode_where_they_work() -> None:
    values = space_for(A100).values
    assert values["cudnn_benchmark"] == (False, True) and values["tf32"] == (False, True)
    assert values["decode"] == ("cpu", "gpu") and "reduce-overhead" in values["compile"]
    assert space_for(T4).values["tf32"] == (False,)
    task = Workload(model="m:f", device="cuda:0", task="m:f", fixed_shapes=False, own_optimizer=True)
    values = space_for(A100, task).values
    assert values["cudnn_benchmark"] == (False,) and values["decode"] == ("cpu",) and values["optimizer_impl"] == (None,)


@pytest.mark.parametrize(
    ("device", "workload", "text", "match"),
    [
        (CPU, None, "tf32=true", "^--set tf32 needs a CUDA device"),
        (CPU, None, "cudnn_benchmark=true", "^--set cudnn_benchmark needs a CUDA device"),
        (CPU, None, "decode=gpu", "^--set decode=gpu needs a CUDA device"),
        (CPU, None, "compile=reduce-overhead", "^--set compile=reduce-overhead uses CUDA graphs .* use --set compile=default$"),
        (T4, None, "tf32=true", "no TF32 tensor cores"),
        (A100, Workload(model="m:f", device="cuda:0", task="m:f", fixed_shapes=False), "cudnn_benchmark=true", "change shape"),
        (A100, Workload(model="m:f", device="cuda:0", task="m:f"), "decode=gpu", "not to a Task"),
        (CPU, Workload(model="m:f", task="m:f", own_optimizer=True), "optimizer_impl=fused", "its own optimizer"),
    ],
)
def test_set_of_a_knob_that_cannot_work_here_is_refused(device: DeviceInfo, workload: Workload | None, text: str, match: str) -> None:
    with pytest.raises((SetupError, UsageError), match=match) as info:
        space_for(device, workload, text)
    assert "\n" not in str(info.value)


def test_set_pins_and_bounds_the_new_knobs() -> None:
    space = space_for(CPU, None, "num_threads=1", "optimizer_impl=foreach,fused", "compile=default")
    assert space.values["num_threads"] == (1,) and space.values["optimizer_impl"] == ("foreach", "fused")
    assert space.compile_modes() == ()  # pinned: every trial compiles, no refinement
    assert parse_constraint("num_threads=1..2").high == 2
    assert parse_constraint("compile=max_autotune_no_cudagraphs").value == "max-autotune-no-cudagraphs"
    with pytest.raises(UsageError, match="expected one of for-loop, foreach, fused, auto"):
        parse_constraint("optimizer_impl=turbo")
    # torch's own choice, as the space: line and best.json's setup line write None, is a value --set takes too.
    assert pinned_values(["optimizer_impl=auto"]) == {"optimizer_impl": None}
    assert space_for(CPU, None, "optimizer_impl=auto,foreach").values["optimizer_impl"] == (None, "foreach")
    assert pinned_values(["num_threads=1", "compile=default"]) == {"num_threads": 1, "compile": "default"}
    with pytest.raises(UsageError, match="give one value"):
        pinned_values(["num_threads=1..2"])


def test_set_offers_torchs_own_thread_count_as_auto() -> None:
    assert pinned_values(["num_threads=auto"]) == {"num_threads": None}
    assert space_for(CPU, None, "num_threads=auto").values["num_threads"] == (None,)
    assert space_for(CPU, None, "num_threads=auto,1").values["num_threads"] == (None, 1)
    # A range bounds the counts: torch's own choice is not among them, and an open bound needs no count.
    assert space_for(CPU, None, "num_threads=..1").values["num_threads"] == (1,)
    assert space_for(CPU, None, "num_threads=2..").values["num_threads"] == (2,)
    for text in ("num_threads=auto..2", "num_threads=1..none"):  # either spelling of torch's own choice
        with pytest.raises(UsageError, match="as a choice"):
            parse_constraint(text)
    with pytest.raises(UsageError, match="an integer or auto"):
        parse_constraint("num_threads=many")


def test_fixed_shapes_are_detected_from_the_first_items() -> None:
    assert same_shapes([(torch.zeros(3, 8, 8), 1), (torch.zeros(3, 8, 8), 0)])
    assert not same_shapes([(torch.zeros(5), 1), (torch.zeros(7), 0)])


def test_token_lists_a_collate_pads_change_shape() -> None:
    """Tokenizers return lists: no tensor until collated, yet the padded batches change shape every step."""
    import autotune
    from autotune.workloads.tasks import check_task

    def pad(items: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(tokens) for tokens, _ in items)
        return torch.tensor([tokens + [0] * (width - len(tokens)) for tokens, _ in items]), torch.tensor([y for _, y in items])

    class Bag(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(4, 4), torch.nn.Linear(4, 2)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(tokens).mean(dim=1))

    def task(lengths: list[int]) -> autotune.Task:
        return autotune.Task(Bag(), [([1] * n, n % 2) for n in lengths], collate_fn=pad, batch_size=2)

    assert not check_task(task([3, 3, 5, 3, 4, 3, 3, 3]), workers=False).fixed_shapes  # item 2 is longer
    assert check_task(task([3] * 8), workers=False).fixed_shapes


# ------------------------------------------------------- the trial process
def test_trial_applies_threads_and_optimizer_kernels(tiny_workload: Workload) -> None:
    result = run_trial(TrainSetup(batch_size=8, num_threads=1, optimizer_impl="fused"), tiny_workload, QUICK)
    assert result.ok, result.error
    assert result.num_threads == 1 and result.compile_s is None


def test_compiled_trial_records_compile_time(tiny_workload: Workload) -> None:
    from dataclasses import replace

    workload = replace(tiny_workload, model="factories:tiny_mlp")
    result = run_trial(TrainSetup(batch_size=8, compile="default", num_threads=1, optimizer_impl="foreach"), workload, QUICK)
    assert result.ok, result.error
    assert result.compile_s is not None and 0 < result.compile_s <= result.warmup_s


def test_a_model_that_fails_to_compile_is_an_error_status(tiny_workload: Workload, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from torch._dynamo.exc import Unsupported

    class Uncompilable(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise Unsupported("data-dependent control flow this backend cannot trace")

    monkeypatch.setattr(torch, "compile", lambda model, mode=None: Uncompilable(model))
    request = {"setup": TrainSetup(batch_size=8, compile="default").to_dict(),
               "workload": replace(tiny_workload, model="factories:tiny_mlp").to_dict(),
               "options": {"trial_seconds": 0.2, "windows": 1}}
    result = execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "error"
    assert result.error is not None and result.error.startswith("torch.compile (mode default) failed: Unsupported: data-dependent")
    # A machine without the C++ compiler inductor needs on a CPU: the line says what to do (it named only the cause).
    from torch._inductor.exc import InvalidCxxCompiler

    class NoCompiler(Uncompilable):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise InvalidCxxCompiler()

    monkeypatch.setattr(torch, "compile", lambda model, mode=None: NoCompiler(model))
    result = execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "error" and (result.error or "").startswith("torch.compile (mode default) failed: InvalidCxxCompiler: ")
    assert (result.error or "").endswith("; install a C++ compiler (g++) or set CXX to one, or --set compile=off"), result.error
    # A dynamo error's first line alone dropped what to do and where: its explanation and the user's line are kept.
    from torch._dynamo.exc import TorchRuntimeError

    text = ("RuntimeError when making fake tensor call\n  Explanation: There was no fake impl registered for <CustomOpDef(probe::scale)>. "
            "Please use `scale.register_fake` to add an fake impl.\n  Hint: ...\n\nfrom user code:\n   File \"wl.py\", line 69, in "
            "forward\n  File \"/torch/_library/custom_ops.py\", line 866, in __call__\n")

    class Fakeless(Uncompilable):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise TorchRuntimeError(text)

    monkeypatch.setattr(torch, "compile", lambda model, mode=None: Fakeless(model))
    said = execute(request, started=time.perf_counter(), send=lambda event: None).error or ""
    assert said.startswith("torch.compile (mode default) failed: TorchRuntimeError: RuntimeError when making fake tensor call (There was "
                           "no fake impl registered") and "register_fake" in said and said.endswith(', at File "wl.py", line 69, in forward'), said


# ------------------------------------------------------------ compile payoff
def _record(number: int, setup: TrainSetup, step: float, compile_s: float | None = None, role: str = "search") -> TrialRecord:
    result = TrialResult(status="ok", samples_per_s=setup.batch_size / step, step_time_s=step, compile_s=compile_s)
    return TrialRecord(number, role, setup, result)


def test_break_even_is_compile_time_over_step_time_saved() -> None:
    eager = TrainSetup(batch_size=64)
    records = [_record(0, eager, 0.5), _record(1, eager.replace(compile="default"), 0.4, 30.0, ROLE_COMPILE)]
    (payoff,) = payoffs(records)
    assert payoff.break_even_steps == 300  # 30 s / 0.1 s saved per step
    note = payoff_note(records, eager.replace(compile="default"))
    assert note == "compile=default: compiling took 30 s in the first step; it pays off after 300 steps"
    assert payoff_note(records, eager) is None
    # The winner the float32 twin of the compiled bf16 trial, measured in the confirmation only: its sibling's cost is named.
    twin = eager.replace(compile="default", amp="off")
    bf16 = [_record(0, eager.replace(amp="bf16"), 0.5), _record(1, eager.replace(compile="default", amp="bf16"), 0.4, 30.0, ROLE_COMPILE)]
    said = payoff_note(bf16, twin) or ""
    assert said.startswith("compile=default: the first step compiles the model; the winner ran no trial of its own") and (
        "compiling took 30 s in the first step of bs=64 w=0 bf16 compile=default's trial, where it paid off after 300 steps" in said), said
    section = compile_section(records)
    assert section is not None and section.tables[0].rows[0][-1] == "300"
    slower = [_record(0, eager, 0.5), _record(1, eager.replace(compile="default"), 0.6, 30.0)]
    assert payoffs(slower)[0].break_even_steps is None
    assert payoff_note(slower, eager.replace(compile="default")) == (
        "compile=default: compiling took 30 s in the first step; its search trial was not faster per step "
        "than the same setup eager (600 ms against 500 ms)"
    )


def test_a_compiled_setup_must_beat_its_eager_twin_beyond_the_noise() -> None:
    from autotune.rounds import Candidate, Confirmed
    from autotune.tuner.choice import choose_winner
    from autotune.tuner.finalists import pick_candidates

    eager, other, defaults = TrainSetup(batch_size=64), TrainSetup(batch_size=16), TrainSetup()
    compiled = eager.replace(compile="default")
    # A trial 2 % faster than its eager twin is no finalist; 10 % faster is.
    close = [_record(0, defaults, 1.0), _record(1, eager, 0.50), _record(2, other, 0.2), _record(3, compiled, 0.49, 30.0)]
    assert [c.setup for c in pick_candidates(close, defaults, 3)] == [eager, other, defaults]
    clear = [*close[:3], _record(3, compiled, 0.45, 30.0)]
    assert [c.setup for c in pick_candidates(clear, defaults, 3)][0] == compiled

    def confirmed(setup: TrainSetup, *values: float) -> Confirmed:
        return Confirmed(Candidate(setup.to_json(), setup, setup.describe()), values, ())

    base = confirmed(defaults, 30.0, 31.0, 29.0)
    # Compiled leads by 2 %: within the noise, so the eager twin wins and the note says why.
    chosen, notes = choose_winner([confirmed(compiled, 102.0, 103.0, 101.0), confirmed(eager, 100.0, 101.0, 99.0), base],
                                  defaults.to_json(), 32)
    assert chosen.candidate.setup == eager
    assert any("runs eagerly (no compilation at every start) and is within the noise" in n for n in notes)
    # Compiled leads by 20 % in every round: it wins.
    chosen, _ = choose_winner([confirmed(compiled, 120.0, 121.0, 119.0), confirmed(eager, 100.0, 101.0, 99.0), base],
                              defaults.to_json(), 32)
    assert chosen.candidate.setup == compiled


def test_a_search_compiles_the_leading_setup_near_its_end(tmp_path: Path, cache_dir: Path) -> None:
    from dataclasses import replace

    from test_search import config, fake_runner, search

    def compiling_runner(setup: TrainSetup, workload: Workload, options: Any = None, *, on_window: Any = None) -> TrialResult:
        result = fake_runner(setup, workload, options, on_window=on_window)
        if setup.compile == "off" or not result.ok or result.step_time_s is None or result.samples_per_s is None:
            return result
        return replace(result, compile_s=20.0, step_time_s=result.step_time_s / 1.25, samples_per_s=result.samples_per_s * 1.25)

    outcome = search(config(tmp_path, cache_dir, trials=MIN_TRIALS), runner=compiling_runner)
    compiled = [r for r in outcome.records if r.role == ROLE_COMPILE]
    assert len(compiled) == 1 and compiled[0].setup.compile == "default"
    eager = [r for r in outcome.records if r.role != ROLE_COMPILE and r.number < compiled[0].number and r.result.ok]
    fastest = max(r.result.samples_per_s or 0.0 for r in eager)
    base = [r for r in eager if r.setup == compiled[0].setup.replace(compile="off")]
    assert base and base[0].result.samples_per_s == fastest  # the leader, compiled
    assert all(r.setup.compile == "off" for r in outcome.records if r.role != ROLE_COMPILE)
    assert outcome.best is not None and outcome.best.setup.compile == "default"  # 1.25x faster: it wins confirmation
    assert any(n.startswith("compile=default: compiling took 20 s in the first step; it pays off after") for n in outcome.best.notes)
    assert 'id="compile"' in (tmp_path / "out" / "report.html").read_text()
    short = search(config(tmp_path / "short", cache_dir, trials=MIN_TRIALS - 1))
    assert not [r for r in short.records if r.role == ROLE_COMPILE]



def test_the_space_line_of_a_short_search_says_it_compiles_nothing() -> None:
    """--trials 8 --set compile=off,default: the compiled mode the line offers is never tried, and the line says so."""
    from autotune.tuner.refine import compile_skipped

    assert compile_skipped(space_for(CPU), MIN_TRIALS) == ""
    assert compile_skipped(space_for(CPU, None, "compile=off,default"), 8) == (
        "; compile=default not tried: a search of 8 trials (under 20) compiles no trial; "
        "--set compile=default compiles every trial")
    assert compile_skipped(space_for(CPU, None, "compile=default"), 8) == ""  # every trial compiles
    assert compile_skipped(space_for(CPU, None, "compile=off"), 8) == ""


def test_compile_trials_are_queued_counting_other_workers_running_trials(tmp_path: Path) -> None:
    """A shared study: trials other workers are running count, or every worker would queue its own compile trials late."""
    from autotune.tuner.refine import compile_setup, enqueue_compile_trials
    from autotune.tuner.study import ATTR_ROLE, SearchStudy

    study = SearchStudy.open(f"sqlite:///{tmp_path / 'study.db'}", "shared", trials=MIN_TRIALS, shared=True)
    space = space_for(CPU)
    assert space.compile_modes() == ("default",)
    for batch in range(1, MIN_TRIALS - 1):  # all but two of the budget finished; batch 8 is the fastest
        trial, _ = study.ask()
        result = TrialResult(status="ok", samples_per_s=100.0 + (50.0 if batch == 8 else batch))
        study.record(trial, "search", TrainSetup(batch_size=batch), result, None)
        study.tell(trial, result)

    def queued() -> list[TrainSetup]:
        return [compile_setup(t.user_attrs) for t in study.study.get_trials(deepcopy=False) if t.user_attrs.get(ATTR_ROLE) == ROLE_COMPILE]

    enqueue_compile_trials(study, space, MIN_TRIALS)
    assert queued() == []  # two eager trials of the budget are left
    study.study.ask()  # another worker is running one of them
    enqueue_compile_trials(study, space, MIN_TRIALS, allowed=lambda s: s.batch_size != 8)  # batch 8: defaults a --set excludes
    assert queued() == [TrainSetup(batch_size=MIN_TRIALS - 2, compile="default")]  # the fastest that may lead, compiled, queued once
    enqueue_compile_trials(study, space, MIN_TRIALS)
    assert len(queued()) == 1


def test_an_extended_search_compiles_its_new_leader_at_the_end_of_its_budget(tmp_path: Path) -> None:
    """--trials 120, then the same command with --trials 140: the compile trial ran once per study, so the extension's
    new leader was confirmed beside the old leader compiled, never compiled itself. Each budget's end compiles the
    leader of that moment where it has not run compiled."""
    from autotune.tuner.refine import compile_setup, enqueue_compile_trials
    from autotune.tuner.study import ATTR_ROLE, SearchStudy

    study = SearchStudy.open(f"sqlite:///{tmp_path / 'study.db'}", "grown", trials=MIN_TRIALS)
    space = space_for(CPU)

    def finish(setup: TrainSetup, rate: float) -> None:
        trial, _ = study.ask()
        role = trial.user_attrs.get(ATTR_ROLE, "search")
        setup = compile_setup(trial.user_attrs) if role == ROLE_COMPILE else setup
        result = TrialResult(status="ok", samples_per_s=rate)
        study.record(trial, role, setup, result, None)
        study.tell(trial, result)

    def compiled() -> list[int]:
        return [compile_setup(t.user_attrs).batch_size for t in study.study.get_trials(deepcopy=False)
                if t.user_attrs.get(ATTR_ROLE) == ROLE_COMPILE]

    for batch in range(1, MIN_TRIALS):
        finish(TrainSetup(batch_size=batch), 100.0 + batch)  # batch 19 leads
        enqueue_compile_trials(study, space, MIN_TRIALS)
    assert compiled() == [MIN_TRIALS - 1]
    finish(TrainSetup(), 90.0)  # the compile trial: the budget is spent
    enqueue_compile_trials(study, space, MIN_TRIALS)
    assert compiled() == [MIN_TRIALS - 1]
    wanted = MIN_TRIALS + 5
    for batch in range(100, 103):  # the extension: batch 101 leads, with room for two more eager trials
        finish(TrainSetup(batch_size=batch), 300.0 if batch == 101 else 50.0)
        enqueue_compile_trials(study, space, wanted)
    assert compiled() == [MIN_TRIALS - 1]  # one slot before the last is still the sampler's
    finish(TrainSetup(batch_size=103), 50.0)
    enqueue_compile_trials(study, space, wanted)
    assert compiled() == [MIN_TRIALS - 1, 101]  # the new leader, compiled, in the budget's last slot
    finish(TrainSetup(), 0.0)
    enqueue_compile_trials(study, space, wanted)  # spent
    for batch in (200, 201):  # another extension, up to its last slot, whose leader has run compiled: none queued
        finish(TrainSetup(batch_size=batch), 60.0)
    enqueue_compile_trials(study, space, wanted + 3)
    assert compiled() == [MIN_TRIALS - 1, 101]

def test_compile_trials_queued_are_no_more_than_the_budget_s_slots_left(tmp_path: Path) -> None:
    """On CUDA two compiled modes: a rerun one trial larger whose new leader came up queued both for its one slot, and
    the second waited in the study to run first in the next rerun, not at its end."""
    from autotune.tuner.refine import compile_setup, enqueue_compile_trials
    from autotune.tuner.study import ATTR_ROLE, SearchStudy

    space = space_for(A100)
    assert len(space.compile_modes()) == 2
    study = SearchStudy.open(f"sqlite:///{tmp_path / 'study.db'}", "cuda", trials=MIN_TRIALS)
    for batch in range(1, MIN_TRIALS + 1):  # the budget spent eagerly (its compile trials aside): batch 20 leads
        trial, _ = study.ask()
        result = TrialResult(status="ok", samples_per_s=100.0 + batch)
        study.record(trial, "search", TrainSetup(batch_size=batch), result, None)
        study.tell(trial, result)
    enqueue_compile_trials(study, space, MIN_TRIALS + 1)  # one slot left
    queued = [compile_setup(t.user_attrs) for t in study.study.get_trials(deepcopy=False) if t.user_attrs.get(ATTR_ROLE) == ROLE_COMPILE]
    assert [s.compile for s in queued] == [space.compile_modes()[0]] and queued[0].batch_size == MIN_TRIALS


# ------------------------------------------------------------ emitted train.py
def test_emitted_script_defaults_to_the_tuned_knobs(synthetic_data: Path, tmp_path: Path) -> None:
    from test_emit import defaults, make_best

    from autotune.output.emit import write_script

    best = make_best(synthetic_data, batch_size=8, num_threads=1, compile="default", optimizer_impl="fused")
    args = defaults(write_script(best, tmp_path / "train.py"))
    assert (args.threads, args.compile, args.optimizer_impl, args.decode) == (1, "default", "fused", "cpu")
    assert (args.cudnn_benchmark, args.tf32) == (False, False)
    auto = defaults(write_script(make_best(synthetic_data), tmp_path / "auto.py"))
    assert (auto.threads, auto.compile, auto.optimizer_impl) == (None, "off", "auto")
    gpu = defaults(write_script(make_best(synthetic_data, device="cuda", cudnn_benchmark=True, tf32=True, decode="gpu"),
                                tmp_path / "gpu.py"))
    assert (gpu.cudnn_benchmark, gpu.tf32, gpu.decode) == (True, True, "gpu")


@pytest.mark.slow
def test_emitted_script_applies_threads_and_optimizer_kernels(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import in_process
    from test_emit import make_best, run_here

    from autotune.output.emit import write_script

    best = make_best(synthetic_data, batch_size=8, num_threads=1, optimizer_impl="for-loop")
    script = write_script(best, tmp_path / "train.py")
    out = run_here([str(script), "--max-steps", "2", "--print-freq", "1", "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    assert "threads 1 | compile off" in out and "step 2 loss" in out
    checkpoint = torch.load(tmp_path / "out" / "checkpoint.pth", map_location="cpu", weights_only=True)
    assert checkpoint["optimizer"]["param_groups"][0]["foreach"] is False
    code, _, err = in_process.run_script(script, ["--tf32", "--max-steps", "1"], tmp_path, capfd, monkeypatch)
    assert code != 0 and "this run's flags need" in err and "to train here, add: --no-tf32" in err, err  # --device cpu on a GPU host too


@pytest.mark.parametrize("template", ["train.py.tmpl", "train_task.py.tmpl"])
def test_the_script_counts_the_cores_a_cpu_quota_leaves_on_its_cgroup_or_an_ancestor(template: str, tmp_path: Path) -> None:
    """train.py's --threads warning counted the affinity mask alone: under docker --cpus=1 on 2 cores, --threads 2
    went unsaid where the search (probes.usable_cores) counts 1. It then read the quota of the cgroup root alone, which
    misses one set on the process's own cgroup below it or on a parent (systemd's CPUQuota= on a slice, Slurm)."""
    import os

    usable = _template_function(template, "usable_cores", "cpu_quotas")["usable_cores"]
    mask = len(os.sched_getaffinity(0))
    root_v2, root_v1 = tmp_path / "root_v2", tmp_path / "root_v1"
    (tmp_path / "v2").write_text("0::/\n")
    (tmp_path / "v1").write_text("4:cpu,cpuacct:/\n2:memory:/\n")
    assert usable(str(tmp_path / "none"), str(tmp_path / "v2")) == mask  # no cgroup files: the affinity mask
    root_v2.mkdir()
    (root_v2 / "cgroup.controllers").write_text("cpu memory\n")  # what marks a cgroup v2 mount
    for text, cores in (("max 100000\n", mask), ("100000 100000\n", 1), ("150000 100000\n", 1), ("50000 100000\n", 1),
                        (f"{100000 * (mask + 4)} 100000\n", mask), ("100000 0\n", mask), ("-5 100000\n", mask)):  # malformed: none
        (root_v2 / "cpu.max").write_text(text)
        assert usable(str(root_v2), str(tmp_path / "v2")) == cores, text
    (root_v1 / "cpu,cpuacct").mkdir(parents=True)
    (root_v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    for quota, cores in (("-1", mask), ("100000", 1)):
        (root_v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text(quota + "\n")
        assert usable(str(root_v1), str(tmp_path / "v1")) == cores, quota
    # A quota on the process's own cgroup, or on a parent of it, below a root that sets none (v2 and v1 alike).
    (root_v2 / "cpu.max").write_text("max 100000\n")
    (root_v2 / "system.slice" / "job.scope").mkdir(parents=True)
    (root_v2 / "system.slice" / "job.scope" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "v2_job").write_text("0::/system.slice/job.scope\n")
    assert usable(str(root_v2), str(tmp_path / "v2_job")) == mask
    (root_v2 / "system.slice" / "cpu.max").write_text("100000 100000\n")
    assert usable(str(root_v2), str(tmp_path / "v2_job")) == 1  # the parent's
    (root_v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (root_v1 / "cpu,cpuacct" / "q1").mkdir()
    (root_v1 / "cpu,cpuacct" / "q1" / "cpu.cfs_period_us").write_text("100000\n")
    (root_v1 / "cpu,cpuacct" / "q1" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "v1_q1").write_text("4:cpu,cpuacct:/q1\n")
    assert usable(str(root_v1), str(tmp_path / "v1_q1")) == 1  # its own
    assert usable(str(root_v1), str(tmp_path / "v1")) == mask
    (tmp_path / "outside").write_text("4:cpu,cpuacct:/../host/q1\n")  # outside the container's view: its root alone
    assert usable(str(root_v1), str(tmp_path / "outside")) == mask
    # The hybrid layout (v1 controllers, v2 at unified/): a quota on the v2 mount there is read too.
    hybrid = tmp_path / "hybrid"
    (hybrid / "unified").mkdir(parents=True)
    (hybrid / "unified" / "cgroup.controllers").write_text("cpu\n")
    (hybrid / "unified" / "cpu.max").write_text("100000 100000\n")
    assert usable(str(hybrid), str(tmp_path / "v2")) == 1


def test_the_script_says_torch_s_own_thread_count_is_above_a_cpu_quota(synthetic_data: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --threads, torch's own count under a CPU quota below it (docker --cpus=1 on 2 cores: 2 threads) trained
    1.2-1.9x slower than the quota's count, and the script said nothing: it now names --threads N. No word where
    --threads is given, or where torch's count fits."""
    from test_emit import CPU_KNOBS, load_script, make_best, write_script

    configure_torch = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))["configure_torch"]
    namespace = configure_torch.__globals__  # the script's own globals (run_path returns a copy)
    said: list[str] = []
    monkeypatch.setitem(namespace, "log", said.append)
    monkeypatch.setitem(namespace, "usable_cores", lambda: 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    args = type("Args", (), {"threads": None, "cudnn_benchmark": False, "tf32": False})()
    configure_torch(args, torch.device("cpu"))
    assert said == ["warning: torch's own 2 threads are more than the 1 CPU core this process may use (torch counts the "
                    "cores, not a CPU quota): --threads 1 is likely faster (under a 1-CPU quota one thread trained "
                    "1.2-1.9x as fast as two)"]
    said.clear()
    args.threads = 1
    configure_torch(args, torch.device("cpu"))
    args.threads = 2  # more than the quota's core: the way out is --threads 1, not auto (torch's own 2 again)
    configure_torch(args, torch.device("cpu"))
    assert said == ["warning: --threads 2 is more than the 1 CPU core this process may use: the threads share them, which "
                    "slows the step (--threads 1)"]
    said.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # under taskset -c 0: no quota, the variable is the cause
    args.threads = None
    configure_torch(args, torch.device("cpu"))
    assert said[-1].startswith("warning: torch's own 2 threads are more than the 1 CPU core this process may use "
                               "(OMP_NUM_THREADS=2 sets it): --threads 1 is likely faster")
    monkeypatch.delenv("OMP_NUM_THREADS")
    said.clear()
    monkeypatch.setitem(namespace, "usable_cores", lambda: 2)
    configure_torch(args, torch.device("cpu"))
    assert said == []


def _thread_warnings(best: Any, path: Path, monkeypatch: pytest.MonkeyPatch, here: dict[str, str]) -> list[str]:
    """What the script of ``best`` logs as it configures torch on 64 cores under the thread variables ``here``."""
    from test_emit import load_script, write_script

    configure_torch = load_script(write_script(best, path))["configure_torch"]
    said: list[str] = []
    monkeypatch.setitem(configure_torch.__globals__, "log", said.append)
    monkeypatch.setitem(configure_torch.__globals__, "usable_cores", lambda: 64)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in here.items():
        monkeypatch.setenv(name, value)
    configure_torch(type("Args", (), {"threads": None, "cudnn_benchmark": False, "tf32": False})(), torch.device("cpu"))
    return said


@pytest.mark.parametrize(("search", "world", "here", "warned"), [
    ({"OMP_NUM_THREADS": "1"}, 1, {}, "with OMP_NUM_THREADS=1, here neither OMP_NUM_THREADS nor MKL_NUM_THREADS set"),
    ({}, 1, {"MKL_NUM_THREADS": "1"}, "with neither OMP_NUM_THREADS nor MKL_NUM_THREADS set, here MKL_NUM_THREADS=1"),
    ({"OMP_NUM_THREADS": "1"}, 1, {"OMP_NUM_THREADS": "1"}, None),
    ({"OMP_NUM_THREADS": "1"}, 1, {"OMP_NUM_THREADS": "01", "MKL_NUM_THREADS": "1"}, None),  # 1 thread either way
    ({"OMP_NUM_THREADS": "2"}, 1, {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "1"},
     "with OMP_NUM_THREADS=2, here OMP_NUM_THREADS=2 and MKL_NUM_THREADS=1"),
    ({}, 2, {"OMP_NUM_THREADS": "1"}, None),  # torchrun's own setting for several processes, as the DDP trials had it
    (None, 1, {"OMP_NUM_THREADS": "1"}, None),  # a best.json of an earlier version: not recorded
])
def test_the_script_says_where_torch_s_own_thread_count_was_not_measured(
    synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, search: dict[str, str] | None, world: int,
    here: dict[str, str], warned: str | None,
) -> None:
    """A search under OMP_NUM_THREADS=1 measured torch's own count as 1 thread and recorded `auto`: its train.py run
    without the variable trained 2 threads, a setup no trial ran, without a word."""
    import dataclasses

    from test_emit import CPU_KNOBS, make_best

    hardware = {"cpu": {"thread_env": search}} if search is not None else {}
    best = dataclasses.replace(make_best(synthetic_data, hardware=hardware, **CPU_KNOBS), world_size=world)
    said = _thread_warnings(best, tmp_path / "train.py", monkeypatch, here)
    if warned is None:
        assert said == []
    else:
        assert len(said) == 1 and f"the search measured torch's own thread count (--threads auto) {warned}: torch's own" in said[0]


@pytest.mark.parametrize("offset", [0, 1])
def test_the_script_compares_the_thread_count_the_trials_ran_beside_the_variables(
    synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset: int
) -> None:
    """OMP_NUM_THREADS=8 on a 2-core machine: torch ran 2 threads in the trials, as it does without the variable; the
    script compared the variables (8 against none) and warned of a count the search had measured."""
    import dataclasses

    from test_emit import CPU_KNOBS, make_best

    ran = torch.get_num_threads() + offset
    best = dataclasses.replace(make_best(synthetic_data, hardware={"cpu": {"thread_env": {"OMP_NUM_THREADS": "8"}}}, **CPU_KNOBS),
                               torch_threads=ran)
    said = _thread_warnings(best, tmp_path / "train.py", monkeypatch, {})
    if offset == 0:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(f"warning: the search measured torch's own {ran} threads, with OMP_NUM_THREADS=8, "
                                                     "here neither OMP_NUM_THREADS nor MKL_NUM_THREADS set: torch's own"), said
    # The same setting on another machine (another count of cores): no variable's doing, not said.
    assert _thread_warnings(dataclasses.replace(best, hardware={"cpu": {"thread_env": {}}}), tmp_path / "same.py", monkeypatch, {}) == []
