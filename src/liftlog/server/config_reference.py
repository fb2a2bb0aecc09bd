"""docs/configuration.md, generated from the configuration schema (``config.SETTINGS``) so that it cannot drift.

    python -m liftlog.server.config_reference > docs/configuration.md

``tests/server/test_config_reference.py`` fails when the file differs from what this prints.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from liftlog.server.config import ENV_PREFIX, NO_EFFECT, SETTINGS, Setting
from liftlog.units import parse_duration_ms, parse_size

__all__ = ["reference_markdown"]

_INTRO = """# Configuration reference

Generated from the server's configuration schema by `python -m liftlog.server.config_reference`; a test
keeps it current. How settings are given (a YAML file with `-c`, `LIFTLOG_<KEY>` environment variables,
flags, `--set KEY=VALUE`; later sources win) and an example file are in the README's "Configuration"
section.

Units: sizes take `B`, `KiB`, `MiB`, `GiB` (and `KB`, `MB`, `GB`) or a number of bytes; durations take
Go's form (`250ms`, `10s`, `5m`, `1h30m`) or a number of milliseconds. A key accepted only because
Liftbridge's configurations may hold it, and which changes nothing here, says so; a server given one
warns at start.
"""


def _kind(parse: Callable[[object], object]) -> str:
    if parse is parse_size:
        return "size"
    if parse is parse_duration_ms:
        return "duration"
    name = getattr(parse, "__qualname__", "")
    if name.startswith("_choice"):
        options = next(c.cell_contents for c in parse.__closure__ or () if isinstance(c.cell_contents, tuple))
        return " \\| ".join(f"`{o}`" for o in options)
    return {
        "_bool": "true/false",
        "_str": "text",
        "_name": "name",
        "_list": "list",
        "_listen": "host:port",
        "_replicas": "integer",
    }.get(name.split(".")[0], "integer")


def _default(setting: Setting, kind: str) -> str:
    value = setting.default
    if value in ("", (), None):
        return "(unset)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if kind == "size" and isinstance(value, int) and value:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"`{value // size}{unit}`"
    if kind == "duration" and isinstance(value, int) and value:
        for unit, ms in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if value % ms == 0:
                return f"`{value // ms}{unit}`"
        return f"`{value}ms`"
    if isinstance(value, tuple):
        return "`" + ",".join(value) + "`"
    return f"`{value}`"


def _env(key: str) -> str:
    return ENV_PREFIX + re.sub(r"[.\-]", "_", key).upper()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    sections: dict[str, list[Setting]] = {}
    for setting in SETTINGS:
        sections.setdefault(setting.key.split(".")[0] if "." in setting.key else "(top level)", []).append(setting)
    out = [_INTRO]
    for section, settings in sections.items():
        out.append(f"\n## {section}\n\n| key | default | kind | what it does |\n|---|---|---|---|")
        for s in settings:
            kind = _kind(s.parse)
            what = _cell(s.help)
            if s.key in NO_EFFECT:
                what = "accepted for Liftbridge's configurations; no effect here (a server given it warns)"
            out.append(f"| `{s.key}`<br>`{_env(s.key)}` | {_default(s, kind)} | {kind} | {what} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
