"""The Nexmark benchmark's modules (bench/nexmark/) are imported by its tests from the
repository root, where `python -m bench.nexmark` runs them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
