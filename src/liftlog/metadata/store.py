"""The standalone server's metadata file: ``<data dir>/metadata.json``, replaced atomically.

A clustered server replaces this with the Raft log; a standalone one writes
the whole state after every change (changes are rare, the file is small).
"""

from __future__ import annotations

import json
from pathlib import Path

from liftlog.storage.checkpoint import write_atomic

from .model import Metadata

__all__ = ["CorruptMetadataError", "MetadataFile"]


class CorruptMetadataError(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(f"metadata file {path} cannot be read: {reason}")


class MetadataFile:
    """Loads and saves :class:`Metadata` as JSON. Blocking file I/O; call from one task."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Metadata:
        """The saved metadata, or empty metadata when the file does not exist yet."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Metadata()
        try:
            return Metadata.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMetadataError(self.path, str(exc)) from exc

    def save(self, metadata: Metadata) -> None:
        data = json.dumps(metadata.to_dict(), indent=1, sort_keys=True).encode()
        write_atomic(self.path, data)
