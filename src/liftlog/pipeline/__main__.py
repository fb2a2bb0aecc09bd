"""``python -m liftlog.pipeline run ...``: the same commands as ``liftlog pipeline``."""

from liftlog.cli.pipeline import pipeline

if __name__ == "__main__":
    pipeline(prog_name="python -m liftlog.pipeline")
