"""``--plot out.png``: bus bandwidth and latency against size, one line per backend.

matplotlib is an optional extra (``bench``); :func:`require` fails early, before anything
is measured, with the command that installs it for the interpreter running pydist.
"""
from __future__ import annotations

import os
import sys

from .report import BackendResult, Meta, measure
from .sizes import format_size


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require() -> None:
    """Raise PlotUnavailable unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise PlotUnavailable(f"--plot needs matplotlib: {install_hint()}") from error


def install_hint(package_dir: str = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) -> str:
    """How to install matplotlib: from a source checkout (``package_dir`` is ``<root>/src/pydist``
    with ``<root>/pyproject.toml``), the ``bench`` extra installed editable; else pip."""
    python = sys.executable
    root = os.path.dirname(os.path.dirname(package_dir))
    if os.path.basename(os.path.dirname(package_dir)) == "src" and os.path.isfile(os.path.join(root, "pyproject.toml")):
        return f"cd {root} && {python} -m pip install -e '.[bench]' (make test-venv installs it too)"
    return f"{python} -m pip install matplotlib"


def write_plot(path: str, meta: Meta, plan: list[tuple[int, int]], results: list[BackendResult]) -> None:
    """Two panels (busbw GB/s, time µs; log-scale sizes) saved to ``path`` (format from suffix)."""
    require()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (bw_axes, time_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for result in results:
        points = [(nbytes, m) for nbytes, _ in plan if (m := measure(meta, result, nbytes)) is not None]
        if not points:
            continue
        sizes = [nbytes for nbytes, _ in points]
        bw_axes.plot(sizes, [m["busbw_gbps"] for _, m in points], marker="o", markersize=3, label=result.label)
        time_axes.plot(sizes, [m["time_us"] for _, m in points], marker="o", markersize=3, label=result.label)
    ticks = [nbytes for nbytes, _ in plan][::max(1, len(plan) // 8)]
    for axes, ylabel in ((bw_axes, "bus bandwidth (GB/s)"), (time_axes, "time (µs)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [format_size(t) for t in ticks], rotation=30)
        axes.set_xlabel("size")
        axes.set_ylabel(ylabel)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    time_axes.set_yscale("log")
    figure.suptitle(f"pydist-bench {meta.op}  nproc={meta.nproc}  dtype={meta.dtype}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
