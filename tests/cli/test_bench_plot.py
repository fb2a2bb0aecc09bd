"""``liftlog bench --plot``: the data preparation (buckets, percentiles), the picture, and a real bench drawing one."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from liftlog.cli.bench_plot import (
    Series,
    bucket_width,
    latency_summary,
    percentile_curve,
    throughput,
    write_plot,
)
from liftlog.cli.bench_scenarios import Result, percentiles

from .test_cli import assert_one_error_line, invoke

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- data preparation ----------------------------------------------------------


def test_bucket_width_gives_at_most_100_buckets() -> None:
    assert bucket_width(0.05) == 0.01
    assert bucket_width(1.0) == 0.01
    assert bucket_width(1.01) == 0.025
    assert bucket_width(20) == 0.25
    assert bucket_width(90) == 1.0
    assert bucket_width(1e6) == 10.0  # the widest there is, however long


def test_throughput_counts_completions_per_bucket() -> None:
    # 10 completions in the first 0.1 s, none in the second, 3 in the last (partial) 0.05 s.
    completions = [i / 100 for i in range(10)] + [0.2, 0.22, 0.24]
    starts, rates = throughput(completions, 0.1, 0.25)
    assert starts == pytest.approx([0.0, 0.1, 0.2])
    # The partial bucket is divided by its 0.05 s, not by 0.1 s: 3 / 0.05 = 60/s.
    assert rates == pytest.approx([100.0, 0.0, 60.0])
    # Every completion is counted once, however close to the edges.
    assert sum(r * min(0.1, 0.25 - s) for s, r in zip(starts, rates, strict=True)) == pytest.approx(13)


def test_throughput_joins_a_short_last_bucket_to_the_one_before() -> None:
    # 0.02 s past the last full bucket: no bucket of its own, whose 1 completion would read as 50/s.
    starts, rates = throughput([0.05, 0.15, 0.21], 0.1, 0.22)
    assert starts == pytest.approx([0.0, 0.1])
    assert rates == pytest.approx([10.0, 2 / 0.12])
    # Shorter than half a bucket in all: one bucket, as long as the run.
    one: object = ([0.0], [pytest.approx(50.0)])  # typed object: mypy sees no overlap with an Approx inside
    assert throughput([0.01, 0.02], 0.1, 0.04) == one


def test_throughput_puts_stragglers_in_the_end_buckets() -> None:
    starts, rates = throughput([-0.001, 0.5, 1.2], 0.5, 1.0)  # before the start, on an edge, past the end
    assert starts == [0.0, 0.5]
    assert rates == pytest.approx([2.0, 4.0])
    assert throughput([0.1], 0.5, 0.0) == ([], [])


def test_latency_summary_matches_the_json_percentiles() -> None:
    latencies_us = [float(i) for i in range(1, 1001)]  # 1..1000 µs, shuffled below
    shuffled = latencies_us[500:] + latencies_us[:500]
    summary = latency_summary(shuffled)
    assert summary == {"p50": 500.0, "p90": 900.0, "p99": 990.0, "p99.9": 999.0, "max": 1000.0}
    # The same nearest rank as the JSON line's figures.
    json_figures = percentiles([int(us * 1000) for us in shuffled])
    assert {q: summary[q] for q in json_figures} == json_figures


def test_percentile_curve_runs_from_min_to_max_in_nines() -> None:
    latencies_us = [float(i) for i in range(1, 10_001)]
    nines, values = percentile_curve(latencies_us, points=41)
    assert len(nines) == len(values) == 41
    assert nines[0] == 0 and nines[-1] == pytest.approx(4.0)  # log10(10,000 samples)
    assert values[0] == 1.0 and values[-1] == 10_000.0
    assert values == sorted(values)
    # 1 nine is p90, 2 are p99, 3 p99.9 (the curve samples every 0.1 nine).
    at = {round(x, 6): v for x, v in zip(nines, values, strict=True)}
    assert (at[1.0], at[2.0], at[3.0]) == (9000.0, 9900.0, 9990.0)
    assert percentile_curve([5.0]) == ([0.0], [5.0])


def test_series_of_a_result_is_in_seconds_and_microseconds() -> None:
    result = Result(3, 0.5, [1000, 2000, 3000], ["1 publisher"], {}, [10**9 + 10**8, 10**9 + 2 * 10**8], 10**9)
    result.marks.append((10**9 + 3 * 10**8, "leader killed"))
    series = Series.of("sync", result)
    assert series is not None
    assert series.completions_s == pytest.approx([0.1, 0.2]) and series.latencies_us == [1.0, 2.0, 3.0]
    marks: object = [(pytest.approx(0.3), "leader killed")]  # typed object: mypy sees no overlap with an Approx
    assert series.marks == marks and series.notes == "1 publisher"
    assert Series.of("group-failover", Result(1, 1.0)) is None  # nothing per message to draw


# -- the picture ---------------------------------------------------------------


def series(scenario: str, rate: float, seconds: float, latency_us: float | None) -> Series:
    n = int(rate * seconds)
    latencies = [latency_us * (1 + i % 100 / 50) for i in range(n)] if latency_us else None
    return Series(scenario, seconds, [i / rate for i in range(n)], latencies)


def test_write_plot_labels_each_run_and_axis(tmp_path: Path) -> None:
    runs = {
        "fsync never": {"sync": series("sync", 1500, 2.0, 700), "consume": series("consume", 20_000, 1.0, None)},
        "fsync always": {"sync": series("sync", 900, 2.0, 1200), "consume": series("consume", 18_000, 1.0, None)},
    }
    runs["fsync always"]["sync"].marks.append((1.0, "leader s2 killed"))
    path = tmp_path / "bench.svg"
    assert write_plot(str(path), runs, "liftlog bench: a test") == 2
    svg = path.read_text()
    text = " ".join(re.sub(r"<[^>]+>", " ", svg).split())  # SVG text is kept as text
    for expected in (
        "liftlog bench: a test",
        "sync: throughput over time",
        "sync: latency percentiles (publish to ack)",
        "consume: throughput over time",
        "consume: no per-message latency",
        "fsync never: 1.5k msgs/s on average",
        "fsync always: 900 msgs/s on average",
        "fsync never: p50 ",
        "latency (ms, log scale)",
        "msgs/s (per 25 ms)",
        "seconds since the scenario's measurement began",
        "leader s2 killed",
        "p99.9",
    ):
        assert expected in text, expected
    assert "fsync always: p50 " in text and "fsync always: p50 " not in text.split("consume")[-1]


def test_write_plot_writes_nothing_without_series(tmp_path: Path) -> None:
    assert write_plot(str(tmp_path / "none.png"), {"": {}}, "t") == 0
    assert not (tmp_path / "none.png").exists()


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    # Before any server is asked: nothing listens at this address, and the error is still about matplotlib.
    line = assert_one_error_line(invoke("bench", "-a", "127.0.0.1:1", "--plot", "out.png"), 1)
    assert line == "error: --plot needs matplotlib: pip install 'liftlog[plot]'"


def test_plot_to_an_unknown_format_is_a_usage_error() -> None:
    result = invoke("bench", "-a", "127.0.0.1:1", "--plot", "out.gif")
    assert result.exit_code == 2 and "name a .png, .svg, .pdf file" in result.stderr, result.output


@pytest.mark.timeout(120)
def test_a_real_bench_draws_a_png(tmp_path: Path) -> None:
    path = tmp_path / "bench.png"
    args = ("bench", "--start-server", "--scenarios", "sync,async,consume", "--count", "300", "--plot", str(path))
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["scenarios"]) == {"sync", "async", "consume"}
    assert "latencies" not in json.dumps(report) and "completions" not in json.dumps(report)
    assert f"wrote 3 scenarios to {path}" in result.stderr
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    # Three rows of two panels, at 110 dpi: 13 in wide, 0.6 + 3 x 3.6 in high.
    assert (width, height) == (1430, 1254)
    assert len(data) > 50_000  # lines, labels and legends, not an empty canvas
