from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import LiftlogProcess, NatsProcess

_names = itertools.count()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsProcess]:
    proc = NatsProcess(tmp_path_factory.mktemp("nats") / "nats.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[LiftlogProcess]:
    """One liftlog server per test module, on the shared nats-server."""
    data = tmp_path_factory.mktemp("liftlog") / "data"
    # Tiny segments let tests see segments roll and retention delete them.
    proc = LiftlogProcess(data, "--set", "streams.segment.max.bytes.min=512", nats_url=nats_server.url).start()
    yield proc
    proc.kill()


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A stream name (and subject) no other test uses."""
    return f"{request.node.name.replace('[', '-').replace(']', '').replace('_', '-')[:60]}-{next(_names)}"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
