"""The sink as a program of its own: ``spark-submit spark_sink/submit.py --topics ...``.

Takes the flags of ``outbox sink``. Kept apart from :mod:`spark_sink.job` so that
the job does not import its own command line (which imports the job to run it).
"""

from __future__ import annotations

import sys

from spark_sink.cli import run_standalone


def main(argv: list[str] | None = None) -> None:
    run_standalone(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
