"""``python -m liftlog`` is the ``liftlog`` command."""

from liftlog.cli.main import main

main()
