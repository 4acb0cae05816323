"""``python -m outbox``: runs the installed ``outbox`` console script.

The command line is composed above the core library (``outbox_cli``), so this
module finds it through the package metadata instead of importing it by name.

``-m`` puts the working directory first on ``sys.path``, where the console
script has its own directory instead: run from a service's root, a ``checker``
package of the service's would then stand in for the outbox's. It is taken off
again (as ``python -P`` does), so both ways of running the command load the same
packages; nothing here imports the caller's modules by name.
"""

import os
import sys
from importlib.metadata import entry_points

if not sys.flags.safe_path and sys.path and sys.path[0] == os.getcwd():
    del sys.path[0]

(script,) = entry_points(group="console_scripts", name="outbox")
script.load()()
