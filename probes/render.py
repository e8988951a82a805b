"""Render a :class:`~probes.hardware.Hardware` as Rich tables (gpustat style)."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from probes.gpu import GpuInfo
from probes.hardware import Hardware
from probes.units import format_bytes, format_cpus

__all__ = ["render"]


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _or_na(value: object) -> str:
    return "n/a" if value is None else str(value)


def _system_table(hw: Hardware) -> Table:
    cpu, mem, shm = hw.cpu, hw.memory, hw.shm
    table = Table(title="System", title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    table.add_row("CPU", _or_na(cpu.model))
    cores = f"[bold]{cpu.usable_cores}[/] usable of {cpu.logical_cores} logical"
    cores += f", {_or_na(cpu.physical_cores)} physical"
    limits = []
    if cpu.affinity_cores < cpu.logical_cores:
        limits.append(f"affinity {cpu.affinity_cores}")
    if cpu.cgroup_cpu_limit is not None:
        limits.append(f"cgroup quota {format_cpus(cpu.cgroup_cpu_limit)}")
    if limits:
        cores += f" ({', '.join(limits)})"
    table.add_row("Cores", cores)
    bf16 = _yes_no(cpu.bf16) + (f" ({', '.join(cpu.bf16_flags)})" if cpu.bf16_flags else "")
    table.add_row("CPU bf16", bf16)
    ram = f"{format_bytes(mem.available_bytes)} available of {format_bytes(mem.total_bytes)}"
    if mem.cgroup_limit_bytes is not None and mem.usable_bytes() < mem.available_bytes:  # the container's limit leaves less
        ram = (f"[yellow]{format_bytes(mem.usable_bytes())} available[/] (cgroup limit {format_bytes(mem.cgroup_limit_bytes)}; "
               f"the host: {ram})")
    elif mem.cgroup_limit_bytes is not None:
        ram += f" (cgroup limit {format_bytes(mem.cgroup_limit_bytes)})"
    if mem.address_space_limit_bytes is not None:
        ram += f" ([yellow]ulimit -v {format_bytes(mem.address_space_limit_bytes)}[/])"
    table.add_row("RAM", ram)
    if shm.total_bytes is None:
        table.add_row(shm.path, "[red]missing[/]")
    else:
        style = "yellow" if any(w.startswith(shm.path) for w in hw.warnings) else ""
        text = f"{format_bytes(shm.free_bytes)} free of {format_bytes(shm.total_bytes)}" + ("" if shm.writable else ", read-only")
        style = style if shm.writable else "red"
        table.add_row(shm.path, f"[{style}]{text}[/]" if style else text)
    return table


def _gpu_line_memory(gpu: GpuInfo) -> str:
    if gpu.memory_total_bytes is None or gpu.memory_free_bytes is None:
        return "n/a"
    used = gpu.memory_total_bytes - gpu.memory_free_bytes
    pct = used / gpu.memory_total_bytes if gpu.memory_total_bytes else 0.0
    style = "yellow" if pct > 0.5 else "green"
    return f"[{style}]{format_bytes(used)}[/] / {format_bytes(gpu.memory_total_bytes)}"


def cpu_ranges(cpus: tuple[int, ...]) -> str:
    """CPU ids as the kernel writes a CPU list: ``0-15,32-47``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def _gpu_table(hw: Hardware) -> RenderableType:
    if not hw.gpus:
        return Text.assemble(("GPUs  ", "bold cyan"), ("none: ", "bold"), (hw.gpu_error or "no GPU found", "dim"))
    driver = next((g.driver_version for g in hw.gpus if g.driver_version), None)
    title = f"GPUs (driver {driver})" if driver else "GPUs"
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1), header_style="bold cyan")
    for name in ("#", "name", "cc", "bf16", "tf32", "memory used", "PCIe", "near CPUs"):
        table.add_column(name, no_wrap=name != "name")
    for gpu in hw.gpus:
        pcie = "n/a"
        if gpu.pcie_generation is not None or gpu.pcie_width is not None:
            generation = f"gen{gpu.pcie_generation}" if gpu.pcie_generation is not None else "gen ?"
            pcie = f"{generation} x{_or_na(gpu.pcie_width)}"
        table.add_row(
            f"[{gpu.index}]",
            f"[bold blue]{_or_na(gpu.name)}[/]",
            _or_na(gpu.compute_capability),
            _yes_no(gpu.bf16),
            _yes_no(gpu.tf32),
            _gpu_line_memory(gpu),
            pcie,
            cpu_ranges(gpu.cpu_affinity) if gpu.cpu_affinity is not None else "n/a",
        )
    return table


def _software_table(hw: Hardware) -> RenderableType:
    sw = hw.software
    cuda = sw.cuda
    if cuda is None:
        cuda = "- (no driver)" if sw.torch_cuda_build else "- (CPU build)"
    columns = [
        ("python", sw.python),
        ("torch", sw.torch),
        ("torchvision", sw.torchvision),
        ("cuda", cuda),
        ("cudnn", sw.cudnn),
        ("optuna", sw.optuna),
        ("autotune", sw.autotune),
    ]
    values = [(name, version if version is not None else "-") for name, version in columns]
    wide = Table(title="Software", title_justify="left", box=None, padding=(0, 1), header_style="bold cyan")
    for name, _ in values:
        wide.add_column(name)
    wide.add_row(*(version for _, version in values))
    tall = Table(title="Software", title_justify="left", show_header=False, box=None, padding=(0, 2))
    tall.add_column(style="bold cyan", no_wrap=True)
    tall.add_column()
    for name, version in values:
        tall.add_row(name, version)
    return _WideOrTall(wide, tall)


class _WideOrTall:
    """A one-row table where it fits the console's width, else the same fields one per line: Rich would cut
    each cell of a row too wide for a narrow terminal to a few characters and an ellipsis (``2.1…`` for 2.14.1)."""

    def __init__(self, wide: Table, tall: Table) -> None:
        self.wide, self.tall = wide, tall

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        natural = Measurement.get(console, options.update_width(1 << 20), self.wide).maximum
        yield self.wide if natural <= options.max_width else self.tall


def render(hw: Hardware) -> RenderableType:
    """Build the human-readable view of a probe.

    Args:
        hw: The probe result.

    Returns:
        A Rich renderable: the system table, the GPU table (or the reason
        there is none), the versions and, in yellow, the warnings.
    """
    parts: list[RenderableType] = [_system_table(hw), Text(), _gpu_table(hw), Text(), _software_table(hw)]
    if hw.warnings:
        body = Group(*(Text(f"• {w}", style="yellow") for w in hw.warnings))
        parts += [Text(), Panel(body, title="warnings", title_align="left", border_style="yellow")]
    return Group(*parts)
