"""Where the benchmarks find the checkout and the shared data beside it.

The shared datasets, traces and profiles are not part of the project (they are too large and
not ours to ship): they live in a ``shared`` folder next to the checkout, or wherever
``AGENTFLOW_SHARED`` points.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("AGENTFLOW_SHARED") or REPO.parent / "shared")
HEXGEN_TRACES = SHARED / "traces" / "hexgen-flow"
