"""The options and argument parsers the ``autotune`` commands share (:mod:`autotune.cli`): one definition, one help text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.errors import UsageError
from autotune.units import plain_float, plain_int


def path_arg(value: str | Path) -> Path:
    """A path option or argument; an empty one, which Path reads as the current directory, is refused."""
    if value == "":
        raise typer.BadParameter("an empty path (write . for the current directory)")
    path = Path(value)
    return path.absolute() if path == Path("-") and value != "-" else path  # ./- names a file (emit's - is stdout)


def int_arg(value: str | int) -> int:
    """An integer option, in ASCII digits with an optional sign (:func:`~autotune.units.plain_int`: not 1_0)."""
    if (number := value if isinstance(value, int) else plain_int(value)) is None:
        raise typer.BadParameter(f"expected an integer, got {value!r}")
    return number


def float_arg(value: str | float) -> float:
    """A number option (:func:`~autotune.units.plain_float`: not 1_0), said as :func:`int_arg` says an integer's."""
    if (number := value if isinstance(value, (int, float)) else plain_float(value)) is None:
        raise typer.BadParameter(f"expected a number, got {value!r}")
    return float(number)


ModelOpt = Annotated[
    Optional[str], typer.Option("--model", "-m", help="torchvision model name or package.module:function (search: resnet50, trial: resnet18).")
]
ImageSizeOpt = Annotated[Optional[int], typer.Option("--image-size", parser=int_arg,
                                                    help="Square crop fed to the model (default 224; inception_v3 299).")]
DataOpt = Annotated[Optional[Path], typer.Option("--data", parser=path_arg, help="ImageFolder directory (default: synthetic JPEGs, generated once).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:K.")]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", parser=float_arg, help="Kill a trial process after this many seconds, its start-up "
                                                    "included (default 90 + 6 x --trial-seconds).")]
TrialSecondsOpt = Annotated[float, typer.Option("--trial-seconds", parser=float_arg, help="Measured steady-state seconds per trial.")]
MaxMemoryOpt = Annotated[Optional[str], typer.Option("--max-memory", help="Memory budget: 20GiB, or 20G (20e9 B); a trial above it is out "
                         "of memory. Unset: trials have none, and the batches searched fit 40 % of the available RAM (90 % of free GPU memory).")]
CacheDirOpt = Annotated[Optional[Path], typer.Option("--cache-dir", parser=path_arg, help="Where synthetic data is generated (default $AUTOTUNE_CACHE, "
                                                     "else $XDG_CACHE_HOME/autotune, else ~/.cache/autotune).")]
SyntheticOpt = Annotated[
    Optional[int], typer.Option("--synthetic-images", parser=int_arg, help="JPEGs made without --data: 16-100000 (default 2000; 16384 on CUDA).")
]
WorkloadOpt = Annotated[Optional[str], typer.Option(
    "--workload", "-w", help="Your training: package.module:function returning autotune.Task (replaces --model/--data/--image-size).")]

NprocOpt = Annotated[int, typer.Option("--nproc-per-node", parser=int_arg, help="Ranks per trial: DDP trials (gloo on CPU, nccl on CUDA).")]

OutOpt = Annotated[Optional[Path], typer.Option("--out", parser=path_arg, help="The same as DIR (the directory a search's --out names).")]


def directory_of(directory: Path | None, out: Path | None) -> Path | None:
    """The directory a command was given, as its argument ``DIR`` or as ``--out`` (the option ``search`` writes it with).

    Raises:
        UsageError: Both were given and name different directories.
    """
    def place(path: Path) -> Path:  # a file given for its directory (emit's DIR/best.json) names that directory
        return (path.parent if path.is_file() else path).absolute()

    if directory is not None and out is not None and place(directory) != place(out):
        raise UsageError(f"DIR {directory} and --out {out} name two directories: give one of them")
    return out if directory is None else directory
