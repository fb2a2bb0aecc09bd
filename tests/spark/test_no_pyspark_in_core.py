"""The core, its CLI and liftlog.spark's planning modules never import pyspark: only the spark extra needs it."""

from __future__ import annotations

import subprocess
import sys


def test_core_and_cli_do_not_import_pyspark() -> None:
    code = (
        "import sys, liftlog.client, liftlog.server.server, liftlog.cli.main, liftlog.spark, "
        "liftlog.spark.options, liftlog.spark.offsets; "
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
