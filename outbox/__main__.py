"""``python -m outbox``: runs the installed ``outbox`` console script.

The command line is composed above the core library (``outbox_cli``), so this
module finds it through the package metadata instead of importing it by name.
"""

from importlib.metadata import entry_points

(script,) = entry_points(group="console_scripts", name="outbox")
script.load()()
