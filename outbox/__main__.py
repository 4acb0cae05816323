"""``python -m outbox``: the same as the ``outbox`` console script."""

from outbox_cli import main

main()
