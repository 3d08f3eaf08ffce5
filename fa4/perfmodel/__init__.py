"""Per-tile cycle model of the attention forward on H100/H200 (SM90) and B200 (SM100):
model.py (the arithmetic), reports.py (validation and tables), cli.py (command line, plots).
Standard library only at import time; docs/perfmodel.md describes it."""

from .cli import *  # noqa: F403
from .model import *  # noqa: F403
from .reports import *  # noqa: F403
