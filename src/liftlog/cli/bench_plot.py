"""``liftlog bench --plot FILE``: throughput over time and latency percentiles of each scenario, as an image.

The data preparation (:func:`bucket_width`, :func:`throughput`,
:func:`latency_summary`, :func:`percentile_curve`) is plain Python; only
:func:`write_plot` imports matplotlib, which is optional (the ``plot``
extra), and draws on a figure of its own with the non-interactive Agg
canvas: no pyplot, no display, no global state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from liftlog.cli.common import CommandError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from liftlog.cli.bench_scenarios import Result

__all__ = [
    "FORMATS",
    "Series",
    "bucket_width",
    "check_plot",
    "latency_summary",
    "percentile_curve",
    "throughput",
    "write_plot",
]

#: File extensions --plot writes (matplotlib picks the format from the extension).
FORMATS = (".png", ".svg", ".pdf")
INSTALL_HINT = "pip install 'liftlog[plot]'"
#: Bucket widths for throughput over time, in seconds: the smallest that gives at most _MAX_BUCKETS.
_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
_MAX_BUCKETS = 100
#: The latency percentiles marked on each curve, as (label, quantile); max is the last sample.
MARKS = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))
#: What each scenario's latency runs from and to (the plot's axis says it).
LATENCY_OF = {
    "sync": "publish to ack",
    "async": "publish to ack, inferred from the window",
    "concurrent": "publish to ack",
    "nats": "publish to ack",
    "e2e": "publish to receipt by a subscriber",
    "cursor": "SetCursor call",
    "rebalance": "join to first message",
    "single": "publish to ack, inferred from the window",
    "rf3-all": "publish to ack, inferred from the window",
    "rf3-leader": "publish to ack, inferred from the window",
    "failover": "publish to ack",
}
#: What a scenario counts, where it is not messages.
UNIT_OF = {"cursor": "calls", "rebalance": "joins"}


@dataclass
class Series:
    """One scenario's run, ready to draw: times in seconds since its measured part began."""

    scenario: str
    seconds: float
    completions_s: list[float]
    latencies_us: list[float] | None
    notes: str = ""
    #: (time in s, label) of events to mark, e.g. the kill of a leader.
    marks: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def of(cls, scenario: str, result: Result) -> Series | None:
        """The series of `result`, or None when it recorded no completion times."""
        if not result.completions_ns:
            return None
        start = result.started_ns
        return cls(
            scenario,
            result.seconds,
            [(t - start) / 1e9 for t in result.completions_ns],
            [ns / 1000 for ns in result.latencies_ns] if result.latencies_ns else None,
            "; ".join(result.notes),
            [((t - start) / 1e9, label) for t, label in result.marks],
        )

    @property
    def rate(self) -> float:
        """Completions per second over the whole run."""
        return len(self.completions_s) / self.seconds if self.seconds > 0 else 0.0


# -- data preparation ----------------------------------------------------------


def bucket_width(duration_s: float) -> float:
    """The smallest of 10 ms, 25 ms, ... 10 s that cuts `duration_s` into at most 100 buckets."""
    for width in _BUCKETS_S:
        if duration_s / width <= _MAX_BUCKETS:
            return width
    return _BUCKETS_S[-1]


def throughput(completions_s: Sequence[float], bucket_s: float, end_s: float) -> tuple[list[float], list[float]]:
    """(start of each bucket, completions per second in it) from 0 to `end_s`.

    A last, partial bucket is divided by its own length: dividing by the whole width would show a slump
    at the end that did not happen. One shorter than half a bucket joins the bucket before it instead: a
    few completions over a sliver of time would show a spike, or a drop, that did not happen either.
    Completions outside 0 .. `end_s` count in the first or last bucket.
    """
    if end_s <= 0:
        return [], []
    full = math.floor(end_s / bucket_s + 1e-9)
    rest = end_s - full * bucket_s
    n = full + 1 if full == 0 or rest >= bucket_s / 2 - 1e-9 else full
    counts = [0] * n
    for t in completions_s:
        counts[min(n - 1, max(0, int(t / bucket_s)))] += 1
    starts = [i * bucket_s for i in range(n)]
    widths = [bucket_s] * (n - 1) + [end_s - starts[-1]]
    return starts, [count / width for count, width in zip(counts, widths, strict=True)]


def _rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of sorted values (as ``percentiles`` in the JSON)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency_summary(latencies_us: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, p99.9 and max (nearest rank), in the unit given."""
    ordered = sorted(latencies_us)
    summary = {label: _rank(ordered, q) for label, q in MARKS}
    summary["max"] = ordered[-1]
    return summary


def percentile_curve(latencies_us: Sequence[float], points: int = 200) -> tuple[list[float], list[float]]:
    """(nines, latency) pairs for a percentile plot: nines = -log10(1 - q), so 1 is p90, 2 p99, 3 p99.9.

    Sampled evenly in nines from p0 to the last sample (the max), whose nines are log10(n).
    """
    ordered = sorted(latencies_us)
    if len(ordered) == 1:
        return [0.0], ordered
    top = math.log10(len(ordered))
    steps = max(1, points - 1)
    nines = [top * i / steps for i in range(steps + 1)]
    values = [_rank(ordered, 1 - 10**-x) if x < top else ordered[-1] for x in nines]
    return nines, values


# -- the picture ---------------------------------------------------------------


def check_plot(path: str) -> None:
    """Fail early, before a bench runs, when `path`'s format is unknown or matplotlib is missing."""
    import click

    if Path(path).suffix.lower() not in FORMATS:
        raise click.BadParameter(f"{path}: name a {', '.join(FORMATS)} file", param_hint="--plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CommandError(f"--plot needs matplotlib: {INSTALL_HINT}") from None


def _format_us(us: float) -> str:
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.3g} ms"
    return f"{us / 1e6:.3g} s"


def _format_rate(rate: float) -> str:
    return f"{rate / 1000:.3g}k" if rate >= 1000 else f"{rate:.0f}"


def _scenarios(runs: Mapping[str, Mapping[str, Series]]) -> list[str]:
    return list(dict.fromkeys(name for series in runs.values() for name in series))


def _draw_throughput(ax: Axes, scenario: str, runs: Mapping[str, Mapping[str, Series]]) -> None:
    present = [(i, label, series[scenario]) for i, (label, series) in enumerate(runs.items()) if scenario in series]
    end = max(s.seconds for _, _, s in present)
    width = bucket_width(end)
    unit = UNIT_OF.get(scenario, "msgs")
    for i, label, s in present:
        starts, rates = throughput(s.completions_s, width, s.seconds)
        # Steps: a bucket's rate holds over the whole bucket. The last step needs its end repeated.
        ax.step([*starts, s.seconds], [*rates, rates[-1]], where="post", color=f"C{i}", linewidth=1.4, label=None)
        legend = f"{label + ': ' if label else ''}{_format_rate(s.rate)} {unit}/s on average"
        ax.axhline(s.rate, color=f"C{i}", linestyle=":", linewidth=1, label=legend)
        for k, (at, text) in enumerate(s.marks):
            ax.axvline(at, color="black", linestyle="--", linewidth=0.8)
            # Each label a line lower than the last: marks a second apart would overlap.
            below = (3, -12 * (k + 1))
            ax.annotate(text, (at, 1), xycoords=("data", "axes fraction"), xytext=below, textcoords="offset points")
    from matplotlib.ticker import FuncFormatter

    ax.set_title(f"{scenario}: throughput over time")
    ax.set_xlabel("seconds since the scenario's measurement began")
    ax.set_ylabel(f"{unit}/s (per {width * 1000:g} ms)")
    ax.yaxis.set_major_formatter(
        FuncFormatter(lambda value, _position: f"{value / 1000:g}k" if value >= 1000 else f"{value:g}")
    )
    ax.set_xlim(0, end)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")


def _draw_latency(ax: Axes, scenario: str, runs: Mapping[str, Mapping[str, Series]]) -> None:
    present = [
        (i, label, series[scenario])
        for i, (label, series) in enumerate(runs.items())
        if scenario in series and series[scenario].latencies_us
    ]
    if not present:
        ax.set_axis_off()
        ax.text(
            0.5,
            0.5,
            f"{scenario}: no per-message latency\n(it measures throughput only)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        return
    top, low, high = 0.0, math.inf, 0.0
    for i, label, s in present:
        assert s.latencies_us is not None
        nines, values = percentile_curve(s.latencies_us)
        top, low, high = max(top, nines[-1]), min(low, values[0]), max(high, values[-1])
        summary = latency_summary(s.latencies_us)
        ax.plot(nines, [v / 1000 for v in values], color=f"C{i}", linewidth=1.4)
        # The marked percentiles, each at its own nines; max at the last sample's.
        marked = [(-math.log10(1 - q), summary[name]) for name, q in MARKS if -math.log10(1 - q) <= nines[-1]]
        marked.append((nines[-1], summary["max"]))
        ax.plot([x for x, _ in marked], [v / 1000 for _, v in marked], "o", color=f"C{i}", markersize=4)
        figures = ", ".join(f"{name} {_format_us(summary[name])}" for name in ("p50", "p99", "p99.9", "max"))
        ax.plot([], [], "o-", color=f"C{i}", label=f"{label + ': ' if label else ''}{figures}")
    ticks = [0.0, -math.log10(0.5), *range(1, math.floor(top) + 1)]
    ax.set_xticks(ticks, ["min", "p50", *(f"p{100 - 100 / 10**x:g}" for x in range(1, math.floor(top) + 1))])
    ax.set_xlim(0, max(top, 1) * 1.02)
    _log_latency_axis(ax, low / 1000, high / 1000)
    ax.set_title(f"{scenario}: latency percentiles ({LATENCY_OF.get(scenario, 'per message')})")
    ax.set_xlabel("percentile (the max at the right end)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="y", alpha=0.1)
    ax.legend(loc="upper left", fontsize="small")


def _log_latency_axis(ax: Axes, low_ms: float, high_ms: float) -> None:
    """A log scale labelled with plain numbers (0.5, 1, 2, 5, 10): over more than a factor of 4 only 1, 2
    and 5 times a power of ten carry a label, or the labels would overlap."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    wide = high_ms > 4 * max(low_ms, 1e-9)

    def label(value: float, _position: float | None) -> str:
        if value <= 0:
            return ""
        leading = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        return f"{value:g}" if not wide or leading in (1, 2, 5) else ""

    ax.yaxis.set_major_formatter(FuncFormatter(label))
    ax.yaxis.set_minor_formatter(FuncFormatter(label))


def write_plot(path: str, runs: Mapping[str, Mapping[str, Series]], title: str) -> int:
    """Draw a row per scenario (throughput over time, latency percentiles), each run of `runs` in its own
    colour (run label -> scenario -> series), and write it to `path` in the format of its extension.

    Returns the number of scenarios drawn; writes nothing and returns 0 when no scenario recorded any.
    """
    scenarios = _scenarios(runs)
    if not scenarios:
        return 0
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # SVG text as text, not outlines: smaller, and it can be searched and read.
    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 9}):
        figure = Figure(figsize=(13, 0.6 + 3.6 * len(scenarios)), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(len(scenarios), 2, squeeze=False)
        for row, scenario in zip(axes, scenarios, strict=True):
            _draw_throughput(row[0], scenario, runs)
            _draw_latency(row[1], scenario, runs)
        figure.suptitle(title, fontsize="large", fontweight="bold")
        figure.savefig(path, dpi=110)
    return len(scenarios)
