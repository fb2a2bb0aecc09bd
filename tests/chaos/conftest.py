"""Fixtures shared by the fault tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.harness import NatsProcess


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsProcess]:
    """A plain nats-server per test module; each test's cluster uses its own namespace."""
    proc = NatsProcess(tmp_path_factory.mktemp("nats") / "nats.log")
    yield proc
    proc.stop()
