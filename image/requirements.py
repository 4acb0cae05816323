"""Print the requirements of the project's wheel with the extras named, one a line.

The images install the dependencies in a layer of their own, before the sources
are copied in: a change to the code then rebuilds only the small layer holding
the project's wheel, not the hundreds of MB of pyspark and confluent-kafka. pip
cannot install a project's dependencies without the project, so this reads them
from pyproject.toml (standard library only: it runs in the bare base image).

    python3 image/requirements.py pyproject.toml postgres spark > requirements.txt
"""

from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    """The base dependencies and those of each extra, as pyproject.toml spells them."""
    with open(pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"no such extra in {pyproject}: {', '.join(unknown)}")
    listed = [*project["dependencies"], *(req for extra in extras for req in optional[extra])]
    own = project["name"]
    nested = [req for req in listed if req.replace("_", "-").startswith(f"{own}[")]
    if nested:  # `kafka-outbox[spark]` inside an extra: name the inner extra instead
        raise SystemExit(f"name the extras inside {nested} directly")
    return listed


def main(argv: list[str]) -> None:
    """``requirements.py PYPROJECT [EXTRA ...]``."""
    if not argv:
        raise SystemExit(__doc__)
    print("\n".join(requirements(argv[0], argv[1:])))


if __name__ == "__main__":
    main(sys.argv[1:])
