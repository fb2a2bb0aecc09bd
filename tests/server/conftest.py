"""A real nats-server per test module, and a connection to it per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import nats
import pytest

from tests.integration.harness import NatsProcess


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc = NatsProcess(tmp_path_factory.mktemp("nats") / "nats.log")
    yield proc.url
    proc.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[nats.NATS]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()
