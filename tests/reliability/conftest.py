"""Make `rel_support` (the suite's shared helpers) importable from the test modules.

pytest runs with `--import-mode=importlib`, which does not put test folders on
`sys.path`; the helpers are plain functions, not fixtures, so they are imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
