"""Fixtures shared by the socket tests of liftlog.rpc."""

from __future__ import annotations

import pytest

from .service import FakeAPI


@pytest.fixture
def service() -> FakeAPI:
    return FakeAPI()
