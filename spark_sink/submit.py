"""The sink as a program of its own: ``spark-submit spark_sink/submit.py --topics ...``.

Takes the flags of ``outbox sink``. Kept apart from :mod:`spark_sink.job` so that
the job does not import its own command line (which imports the job to run it).

Python puts a script's own directory first on ``sys.path``; here that is the
``spark_sink`` package directory, whose ``delta.py`` would then shadow Delta
Lake's ``delta`` package (``--format delta`` failed that way under
``spark-submit``). The directory is taken off the path before anything is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _PACKAGE_DIR]

from spark_sink.cli import run_standalone  # noqa: E402  (after the path is fixed)


def main(argv: list[str] | None = None) -> None:
    run_standalone(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
