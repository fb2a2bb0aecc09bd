"""docs/configuration.md is what the configuration schema says, key for key."""

from __future__ import annotations

from pathlib import Path

from liftlog.server.config import SETTINGS
from liftlog.server.config_reference import reference_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_reference_is_current() -> None:
    assert DOC.read_text() == reference_markdown(), (
        "docs/configuration.md is out of date: python -m liftlog.server.config_reference > docs/configuration.md"
    )


def test_every_key_is_there_with_its_environment_variable_and_default() -> None:
    text = reference_markdown()
    for setting in SETTINGS:
        assert f"| `{setting.key}`<br>`LIFTLOG_" in text
    assert "| `rpc.max.buffered.bytes`<br>`LIFTLOG_RPC_MAX_BUFFERED_BYTES` | `256MiB` | size |" in text
    assert "| `rpc.idle.timeout`<br>`LIFTLOG_RPC_IDLE_TIMEOUT` | `10m` | duration |" in text
    assert "no effect here" in text  # Liftbridge's keys that change nothing say so
