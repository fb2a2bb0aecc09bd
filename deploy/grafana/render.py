"""Draws liftlog-dashboard.json as a PNG from a real Prometheus, for docs where no Grafana runs.

Every panel's queries go, as written in the dashboard, to Prometheus' HTTP API
(``query_range``; ``instant`` targets to ``query``), with the dashboard's
variables filled in (``$stream`` → all, ``$__rate_interval`` → ``--rate``).
Panels are laid out by their ``gridPos`` on Grafana's 24-column grid:
time series as lines, stats as one coloured number, tables as text. It is a
picture of what the dashboard shows, not Grafana's rendering of it.

    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --minutes 10 --out docs/images/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).with_name("liftlog-dashboard.json")


def query(prometheus: str, expr: str, start: float, end: float, step: float, instant: bool) -> list[dict[str, Any]]:
    if instant:
        params = {"query": expr, "time": f"{end:.3f}"}
        path = "/api/v1/query"
    else:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        path = "/api/v1/query_range"
    url = prometheus.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def fill(expr: str, rate: str) -> str:
    return expr.replace('"$stream"', '".*"').replace("$__rate_interval", rate)


def legend(fmt: str, labels: dict[str, str]) -> str:
    if fmt in ("", "__auto"):
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def draw(prometheus: str, minutes: float, rate: str, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    board = json.loads(DASHBOARD.read_text())
    end = time.time()
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 240)
    panels = board["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_height = 0.42  # inches per grid row
    fig = plt.figure(figsize=(24, rows * unit_height + 0.8), dpi=80)
    fig.suptitle(f"{board['title']} — {title}", x=0.01, ha="left", fontsize=16, fontweight="bold")
    top = 1 - 0.8 / (rows * unit_height + 0.8)
    for p in panels:
        g = p["gridPos"]
        rect = (
            g["x"] / 24 + 0.004,
            top - (g["y"] + g["h"]) / rows * top + 0.012,
            g["w"] / 24 - 0.008,
            g["h"] / rows * top - 0.03,
        )
        if p["type"] == "row":
            fig.text(rect[0], top - g["y"] / rows * top - 0.008, p["title"], fontsize=13, fontweight="bold", va="top")
            continue
        if p["type"] == "timeseries":  # room for the y tick labels inside the panel's cell
            rect = (rect[0] + 0.028, rect[1], rect[2] - 0.032, rect[3])
        ax = fig.add_axes(rect)
        ax.set_title(p["title"], fontsize=10, loc="left")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        if p["type"] == "stat":
            t = p["targets"][0]
            result = query(prometheus, fill(t["expr"], rate), start, end, step, True)
            value = float(result[0]["value"][1]) if result else float("nan")
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            bad = value >= steps[1]["value"]
            ax.set_facecolor("#c4162a" if bad else "#37872d")
            ax.text(0.5, 0.45, f"{value:g}", ha="center", va="center", fontsize=26, color="white", fontweight="bold")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        if p["type"] == "table":
            cells: dict[tuple[str, str], dict[str, str]] = {}
            columns = []
            for t in p["targets"]:
                columns.append(t["legendFormat"])
                for series in query(prometheus, fill(t["expr"], rate), start, end, step, True):
                    key = (series["metric"].get("stream", ""), series["metric"].get("partition", ""))
                    cells.setdefault(key, {})[t["legendFormat"]] = f"{float(series['value'][1]):g}"
            header = ["stream", "partition", *columns]
            body = [[k[0], k[1], *(cells[k].get(c, "") for c in columns)] for k in sorted(cells)][:14]
            ax.axis("off")
            if body:
                table = ax.table(cellText=body, colLabels=header, loc="upper left", cellLoc="left")
                table.auto_set_font_size(False)
                table.set_fontsize(9)
            continue
        for t in p["targets"]:
            for series in query(prometheus, fill(t["expr"], rate), start, end, step, False):
                xs = [(float(ts) - end) / 60 for ts, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, linewidth=1.3, label=legend(t["legendFormat"], series["metric"]))
        ax.grid(alpha=0.3)
        ax.set_xlim(-minutes, 0)
        ax.tick_params(labelsize=8)
        ax.set_xlabel("minutes ago", fontsize=8)
        if unit in ("s", "bytes", "Bps", "mps"):
            ax.yaxis.set_major_formatter(EngFormatter(unit={"s": "s", "bytes": "B", "Bps": "B/s", "mps": "/s"}[unit]))
        elif unit == "percentunit":
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles[:8], labels[:8], fontsize=7, loc="upper left", framealpha=0.6)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", default="30s", help="what $__rate_interval becomes")
    parser.add_argument("--title", default="rendered from Prometheus")
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"))
    args = parser.parse_args()
    draw(args.prometheus, args.minutes, args.rate, args.out, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
