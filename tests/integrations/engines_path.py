"""Where the pinned engine packages live for these tests (shared by conftest and tests)."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENGINES = Path(os.environ.get("FP8MLA_ENGINES_PATH") or ROOT / ".venv" / "engines")
UNREACHABLE = ENGINES / "UNREACHABLE"
