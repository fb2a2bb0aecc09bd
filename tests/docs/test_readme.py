"""The README's examples, run as written against real servers.

Every ``sh``, ``python`` and ``yaml`` block in README.md is preceded by a marker that says how it runs:

- ``<!-- test: server -->``: against a standalone server with embedded NATS, set up as ``make run`` sets it
  up (shell blocks see it through ``LIFTLOG_ADDR``, Python blocks have ``127.0.0.1:9292`` replaced by its
  address); blocks run in README order, in one working directory.
- ``<!-- test: fragment -->``: Python statements that use ``client`` (a connected ``Client``): run inside
  ``async with Client(...) as client``.
- ``<!-- test: local -->``: Python that needs no server.
- ``<!-- test: cluster -->``: shell commands that start NATS and servers themselves; the README's ports are
  replaced by free ones. Blocks run in order in one directory, servers started with ``&`` live on.
- ``<!-- test: spark -->``: Python against the standalone server, with PySpark.
- ``<!-- test: config -->``: a server configuration: every key must be known and every value valid.
- ``<!-- test: skip REASON -->``: not run, for the reason given.

A shell line whose comment says ``Ctrl-C`` runs until stopped: it runs for a few seconds, is interrupted,
and must not have failed. A marker ending in ``until-stopped`` does the same for a whole Python block.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent
KINDS = ("server", "fragment", "local", "cluster", "spark", "config", "skip")
MARKER = re.compile(r"<!-- test: (?P<kind>[a-z]+)(?P<rest>[^>]*?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\s*$")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    kind: str
    rest: str
    body: str

    @property
    def until_stopped(self) -> bool:
        return self.rest.strip().endswith("until-stopped")

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.kind} {self.lang})"


def blocks() -> list[Block]:
    lines = README.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        lang = fence["lang"]
        if lang in ("sh", "python", "yaml"):
            marker = MARKER.search(lines[i - 1]) if i else None
            if marker is None:
                raise AssertionError(f"README.md:{i + 1}: a {lang} block without a <!-- test: KIND --> marker above")
            found.append(Block(i + 1, lang, marker["kind"], marker["rest"], "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


def test_every_example_says_how_it_is_tested() -> None:
    found = blocks()
    assert len(found) > 10
    for block in found:
        assert block.kind in KINDS, f"{block}: unknown kind"
        if block.kind == "skip":
            assert len(block.rest.strip()) > 10, f"{block}: a skipped example says why"


def commands(body: str) -> Iterator[str]:
    """The shell commands of a block: continuation lines joined, comment-only lines dropped."""
    pending = ""
    for raw in body.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""


def run_shell_line(command: str, cwd: Path, env: dict[str, str], background: list[subprocess.Popen[bytes]]) -> None:
    code, _, comment = command.partition(" #")
    code = code.rstrip()
    if code.startswith("export "):  # what a reader's shell keeps for the commands after it
        name, _, value = code.removeprefix("export ").partition("=")
        env[name.strip()] = value.strip()
        return
    if code.endswith("&"):
        log = open(cwd / f"background-{len(background)}.log", "wb")  # noqa: SIM115 (the process keeps it)
        proc = subprocess.Popen(
            ["bash", "-c", code[:-1]], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        background.append(proc)
        return
    if "Ctrl-C" in comment:
        proc = subprocess.Popen(
            ["bash", "-c", code],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        time.sleep(4)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, 130, -signal.SIGINT), f"{command}: exit {proc.returncode}: {err.decode()}"
        assert b"Traceback" not in err, f"{command}: {err.decode()}"
        return
    result = subprocess.run(["bash", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{command}\nexit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr}"
    assert "Traceback" not in result.stderr, f"{command}\n{result.stderr}"


def stop_all(background: list[subprocess.Popen[bytes]]) -> None:
    for proc in background:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in background:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run_python(code: str, cwd: Path, env: dict[str, str], until_stopped: bool = False) -> None:
    script = cwd / "example.py"
    script.write_text(code)
    if until_stopped:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=env, stderr=subprocess.PIPE)
        time.sleep(5)
        assert proc.poll() is None, f"stopped by itself: {proc.stderr.read().decode() if proc.stderr else ''}"
        proc.kill()
        proc.wait()
        return
    result = subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{code}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


def example_env(address: str = "", nats_url: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # as with .venv activated
    env["COLUMNS"] = "120"
    if address:
        env["LIFTLOG_ADDR"] = address
    return env


def test_the_configuration_example_is_valid(tmp_path: Path) -> None:
    from liftlog.server.config import load_config

    examples = [b for b in blocks() if b.kind == "config"]
    assert examples
    for block in examples:
        path = tmp_path / f"readme-{block.line}.yaml"
        path.write_text(block.body)
        load_config(path, env={})  # every key known, every value valid (ConfigError names the one that is not)


def fragment_program(body: str, address: str) -> str:
    indented = "\n".join("        " + line for line in body.splitlines())
    return (
        "import asyncio\n"
        "from liftlog.client import *\n\n"
        "handle = print\n\n"
        "async def main() -> None:\n"
        f"    async with Client({address!r}) as client:\n"
        f"{indented}\n\n"
        "asyncio.run(main())\n"
    )


@pytest.mark.slow
@pytest.mark.spark
def test_the_examples_with_a_server_run_as_written(tmp_path: Path) -> None:
    # As `make run` starts it (Makefile): embedded NATS, cursors on, its own cluster secret.
    from tests.integration.harness import LiftlogProcess, free_port

    server = LiftlogProcess(
        tmp_path / "data",
        "--embedded-nats",
        "--embedded-nats-port",
        str(free_port()),
        "--set",
        "cursors.stream.partitions=1",
        bootstrap=None,
        test_key=False,
    ).start()
    work = tmp_path / "work"
    work.mkdir()
    env = example_env(server.address)
    background: list[subprocess.Popen[bytes]] = []
    try:
        for block in blocks():
            if block.kind == "server" and block.lang == "sh":
                for command in commands(block.body):
                    run_shell_line(command, work, env, background)
            elif block.kind in ("server", "spark"):
                run_python(block.body.replace("127.0.0.1:9292", server.address), work, env, block.until_stopped)
            elif block.kind == "fragment":
                run_python(fragment_program(block.body, server.address), work, env, block.until_stopped)
            elif block.kind == "local":
                run_python(block.body, work, env)
    finally:
        stop_all(background)
        server.kill()


@pytest.mark.slow
@pytest.mark.cluster
def test_the_cluster_examples_run_as_written(tmp_path: Path) -> None:
    """NATS and four servers started as the README starts them, the README's ports swapped for free ones."""
    from tests.integration.harness import free_port

    ports = {readme: str(free_port()) for readme in ("9292", "9293", "9294", "9295", "4222")}

    def here(text: str) -> str:
        for readme, free in ports.items():
            text = text.replace(readme, free)
        return text

    env = example_env(f"127.0.0.1:{ports['9292']}")  # the CLI's default address is server a's
    background: list[subprocess.Popen[bytes]] = []
    try:
        for block in blocks():
            if block.kind == "cluster":
                for command in commands(here(block.body)):
                    run_shell_line(command, tmp_path, env, background)
    except AssertionError:
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in tmp_path.glob("*.log"))
        raise AssertionError(logs) from None
    finally:
        stop_all(background)
