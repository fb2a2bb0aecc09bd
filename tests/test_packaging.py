"""The project builds an sdist and a wheel (`python -m build`), and the wheel holds what `pip install` or
`pipx install` of it needs: every package, the generated gRPC stubs, the Spark job script, the command."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_sdist_and_wheel_build_and_hold_everything(tmp_path: Path) -> None:
    # --no-isolation: the build tools of the test environment (setuptools), no download.
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = tmp_path.glob("liftlog-*.whl")
    (sdist,) = tmp_path.glob("liftlog-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "liftlog/cli/main.py",
        "liftlog/server/server.py",
        "liftlog/api/_gen/api_pb2.py",
        "liftlog/api/_gen/api_pb2_grpc.py",
        "liftlog/pipeline/job.py",
        "liftlog/spark/source.py",
    ):
        assert needed in names, f"{needed} is not in {wheel.name}"
    packages = {p.parent.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "liftlog").rglob("__init__.py")}
    assert {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")} >= packages, "a package is missing"
    assert not any(n.startswith("tests/") for n in names), "tests are not shipped"
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "liftlog = liftlog.cli.main:main" in zipfile.ZipFile(wheel).read(meta).decode()
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"README.md", "pyproject.toml", "src/liftlog/__init__.py"} <= members
