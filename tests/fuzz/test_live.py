"""A short live fuzz run in CI (``make fuzz`` runs it for longer): the server survives hostile gRPC requests
and NATS messages with its data unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.fuzz.live import fuzz

pytestmark = pytest.mark.slow


def test_a_live_server_survives_ten_seconds_of_fuzzing(tmp_path: Path) -> None:
    report = asyncio.run(fuzz(10.0, seed=20261124, max_growth_mib=200.0, root=tmp_path))
    assert report["failures"] == []
    assert report["rounds"] > 100
    assert report["control_messages"] == 200
    # Both sides were exercised: refusals of bad requests, and signed internal messages replayed.
    assert report["grpc_codes"].get("INTERNAL", 0) > 0 and report["grpc_codes"].get("OK", 0) > 0
    assert report["captured_signed"] > 0
