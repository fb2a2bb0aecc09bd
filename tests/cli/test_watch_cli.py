"""``liftlog cluster status --watch`` and ``liftlog stream describe --watch``: the views, and against a real server
(embedded NATS) that answers, goes away and comes back."""

from __future__ import annotations

import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from liftlog.cli.cluster import PartitionRow, partitions_table
from liftlog.cli.watch import watch_frame
from liftlog.client import PartitionInfo
from tests.integration.harness import LiftlogProcess, free_port

from .test_cli import invoke

pytestmark = pytest.mark.timeout(120)

WIDE = {"COLUMNS": "200"}  # rich fits tables to the terminal width
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def render(renderable: object, width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def rows_of(text: str, first: str) -> list[list[str]]:
    """The whitespace-split lines of `text` that start with `first`."""
    return [line.split() for line in text.splitlines() if line.split()[:1] == [first]]


# -- the views -----------------------------------------------------------------


def partition(
    pid: int, isr: tuple[str, ...], hw: int, newest: int, *, paused: bool = False, readonly: bool = False
) -> PartitionInfo:
    return PartitionInfo(pid, isr[0] if isr else "", ("a", "b", "c"), isr, hw, newest, paused, readonly)


def test_partitions_table_shows_lag_and_every_state() -> None:
    rows = [
        PartitionRow("orders", partition(0, ("a", "b", "c"), 41, 41), True),
        PartitionRow("orders", partition(1, ("a", "c"), 10, 17), True),  # b out of sync, 7 not committed
        PartitionRow("orders", partition(2, ("b", "c", "a"), 5, 5, paused=True, readonly=True), True),
        PartitionRow("orders", partition(3, ("a", "b", "c"), -1, -1), True, state="election"),
        PartitionRow("orders", partition(4, (), 3, 9), False, state="offline"),  # no leader: metadata only
    ]
    text = render(partitions_table(rows))
    assert rows_of(text, "STREAM") == [["STREAM", "PART.", "LEADER", "ISR", "HW", "NEWEST", "LAG", "STATE"]]
    assert rows_of(text, "orders") == [
        ["orders", "0", "a", "a,b,c", "41", "41", "0", "online"],
        ["orders", "1", "a", "a,c", "(out:", "b)", "10", "17", "7", "under-replicated"],
        ["orders", "2", "b", "b,c,a", "5", "5", "0", "paused,", "readonly"],
        ["orders", "3", "a", "a,b,c", "-1", "-1", "0", "election"],
        # Offsets the leader did not confirm claim no lag.
        ["orders", "4", "—", "(out:", "a,b,c)", "3", "9", "?", "offline,", "under-replicated"],
    ]


def test_watch_frame_keeps_the_last_view_under_an_error_line() -> None:
    ok = render(watch_frame("liftlog cluster status", 2.0, "THE VIEW", None, None, time.time()))
    assert ok.splitlines()[0].startswith("liftlog cluster status  ") and "every 2 s, Ctrl-C to stop" in ok
    assert "error" not in ok and "THE VIEW" in ok
    failed = watch_frame("t", 0.5, "THE VIEW", "no liftlog server\nanswered", time.time() - 5, time.time())
    lines = render(failed).splitlines()
    assert lines[1].startswith("error (retrying every 0.5 s, showing the answer of ")
    assert lines[1].endswith("): no liftlog server answered") and lines[2] == "THE VIEW"
    # Redrawn in place, the error line is cut to the width rather than wrapped.
    live = watch_frame("t", 0.5, None, "x" * 300, None, time.time(), live=True)
    lines = render(live, width=60).splitlines()
    assert len(lines) == 3 and len(lines[1]) == 60 and lines[1].endswith("…")
    assert lines[2] == "waiting for a first answer"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cluster", "status", "--interval", "1"), "--interval needs --watch"),
        (("cluster", "status", "--count", "1"), "--count needs --watch"),
        (("stream", "describe", "s", "--interval", "1"), "--interval needs --watch"),
        (("cluster", "status", "--watch", "--json"), "--json and --watch exclude each other"),
        (("cluster", "status", "--watch", "--interval", "0"), "--interval"),
    ],
)
def test_usage_errors(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_help_names_the_watch() -> None:
    for command in (("cluster", "status"), ("stream", "describe")):
        text = invoke(*command, "--help").stdout
        assert "--watch" in text and "--interval" in text
        assert "--count" not in text  # for scripts and tests only


# -- against a real server -----------------------------------------------------


def start_server(tmp_path: Path) -> LiftlogProcess:
    nats_port = free_port()
    return LiftlogProcess(tmp_path / "data", "--embedded-nats", "--embedded-nats-port", str(nats_port)).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiftlogProcess]:
    """A server (id s1) with stream "orders": 10 messages in partition 1, partition 0 paused."""
    proc = start_server(tmp_path_factory.mktemp("watch"))
    try:
        for args in (
            ("stream", "create", "orders", "--subject", "orders", "--partitions", "2"),
            ("publish", "orders", "-p", "1", *(f"m{i}" for i in range(10))),
            ("stream", "pause", "orders", "-p", "0"),
        ):
            result = invoke(*args, "-a", proc.address)
            assert result.exit_code == 0, result.output
        yield proc
    finally:
        proc.kill()


def test_cluster_status_watch_shows_servers_and_partitions(server: LiftlogProcess) -> None:
    result = invoke("cluster", "status", "--watch", "--interval", "0.2", "--count", "3", "-a", server.address, env=WIDE)
    assert result.exit_code == 0, result.output
    frames = result.stdout.split("liftlog cluster status  ")[1:]
    assert len(frames) == 3  # printed one after another: no terminal here
    for frame in frames:
        assert "error" not in frame
        assert rows_of(frame, "s1")[0][:5] == ["s1", server.address, "—", "controller", "yes"]
        assert rows_of(frame, "orders") == [
            ["orders", "0", "s1", "s1", "-1", "-1", "0", "paused"],
            ["orders", "1", "s1", "s1", "9", "9", "0", "online"],
        ]


def test_stream_describe_watch(server: LiftlogProcess) -> None:
    result = invoke("stream", "describe", "orders", "--watch", "--count", "1", "-a", server.address, env=WIDE)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("liftlog stream describe orders  ")
    text = result.stdout.replace("│", " ")
    assert rows_of(text, "0")[0][:7] == ["0", "s1", "s1", "s1", "-1", "-1", "paused"]
    assert rows_of(text, "1")[0][:7] == ["1", "s1", "s1", "s1", "9", "9", "active"]


def test_describe_watch_of_a_missing_stream_keeps_trying_and_exits_1(server: LiftlogProcess) -> None:
    args = ("stream", "describe", "ghost", "--watch", "--interval", "0.1", "--count", "2", "-a", server.address)
    result = invoke(*args, env=WIDE)
    assert result.exit_code == 1 and "Traceback" not in result.output
    errors = [line for line in result.stdout.splitlines() if line.startswith("error (retrying every 0.1 s)")]
    assert len(errors) == 2 and all(line.endswith("no such stream: ghost") for line in errors)
    assert result.stdout.count("waiting for a first answer") == 2


def test_on_a_terminal_the_view_is_redrawn_in_place(server: LiftlogProcess) -> None:
    env = WIDE | {"TTY_COMPATIBLE": "1", "TERM": "xterm"}  # rich treats stdout as a terminal
    result = invoke("cluster", "status", "--watch", "--interval", "0.1", "--count", "3", "-a", server.address, env=env)
    assert result.exit_code == 0, result.output
    # Live moves the cursor up over the previous frame before drawing the next.
    assert result.stdout.count("\x1b[1A") >= 2 * 10
    text = ANSI.sub("", result.stdout)
    assert text.count("liftlog cluster status  ") >= 3  # (Live draws the last frame once more as it stops)
    assert ["orders", "1", "s1", "s1", "9", "9", "0", "online"] in rows_of(text, "orders")


# -- a server that goes away ---------------------------------------------------


class Frames:
    """The frames a child process prints, read by a thread: lists of lines, each starting with the header."""

    HEADER = "liftlog cluster status  "

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[list[str]] = []
        self._current: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self.lines.put(line.rstrip("\n"))

        threading.Thread(target=pump, daemon=True).start()

    def wait_for(self, check: Callable[[list[str]], bool], what: str, timeout: float = 30) -> list[str]:
        """The first frame completed from now on (the next header began) that passes `check`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if not line.startswith(self.HEADER):
                self._current.append(line)
                continue
            frame, self._current = self._current, [line]
            if frame:
                self.seen.append(frame)
                if check(frame):
                    return frame
        shown = "\n".join(line for frame in self.seen[-2:] for line in frame)
        raise AssertionError(f"no frame with {what} within {timeout} s; the last:\n{shown}")


def answered(frame: list[str]) -> bool:
    """A frame with no error line, showing s1 as the controller."""
    return not frame[1].startswith("error") and any(
        line.split()[:1] == ["s1"] and "controller" in line for line in frame
    )


def test_a_server_that_goes_away_is_an_error_line_until_it_is_back_and_ctrl_c_exits_0(tmp_path: Path) -> None:
    proc = start_server(tmp_path)
    watcher: subprocess.Popen[str] | None = None
    try:
        command = [sys.executable, "-m", "liftlog.cli.main", "cluster", "status", "--watch", "--interval", "0.2"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")} | WIDE
        watcher = subprocess.Popen(
            [*command, "-a", proc.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        frames = Frames(watcher)
        frames.wait_for(answered, "server s1")
        assert proc.stop() == 0

        failed = frames.wait_for(lambda frame: frame[1].startswith("error (retrying"), "an error line")
        assert "showing the answer of" in failed[1] and proc.address in failed[1]
        assert any(line.split()[:1] == ["s1"] for line in failed)  # the last answer stays on screen
        assert watcher.poll() is None  # still watching

        proc.start()
        frames.wait_for(answered, "server s1 again")

        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(10) == 0
        assert watcher.stderr is not None
        stderr = watcher.stderr.read()
        assert "Traceback" not in stderr and "error" not in stderr, stderr
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        proc.kill()
