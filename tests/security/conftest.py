"""Fixtures for the key tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder others may enter (pytest's tmp_path is 0700, which makes any file in it private)."""
    folder = Path(tempfile.mkdtemp(prefix="liftlog-keys-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
