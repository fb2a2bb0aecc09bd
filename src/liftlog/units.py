"""Sizes and durations as people write them (``512MiB``, ``1m30s``), for the config file and the CLI alike."""

from __future__ import annotations

import re

__all__ = ["parse_duration_ms", "parse_size"]

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_SIZE = re.compile(r"(\d+)\s*([kmgt]?i?b?)", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20}
_SIZE_UNITS |= {"g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12, "tib": 1 << 40}


def parse_duration_ms(value: object) -> int:
    """Milliseconds from ``"1m30s"``-style strings or a plain number of milliseconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m or 168h")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return int(value)
    text = str(value).strip()
    if text.isdigit():
        return int(text)
    if text == "0":
        return 0
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_MS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"expected a duration such as 30s, 5m or 168h, got {value!r}")
    return int(total)


def parse_size(value: object) -> int:
    """Bytes from an integer or a string with a unit (``512MiB``, ``1GB``)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 1048576 or 512MiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    match = _SIZE.fullmatch(str(value).strip())
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"expected a size such as 1048576 or 512MiB, got {value!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
