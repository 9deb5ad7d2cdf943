"""Stable pseudo-randomness for the simulator: every "random" choice is a hash of what it is about.

The simulated model, its faults and its latencies must repeat exactly from run to run and across processes, so
nothing here uses a global random state or Python's salted ``hash``: a choice is the SHA-256 of its parts.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

__all__ = ["stable_rng", "stable_unit"]


def _digest(*parts: Any) -> bytes:
    text = "\x1f".join(str(part) for part in parts)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def stable_unit(*parts: Any) -> float:
    """A stable float in [0, 1) derived from ``parts``."""
    return int.from_bytes(_digest(*parts)[:8], "big") / 2**64


def stable_rng(*parts: Any) -> random.Random:
    """A ``random.Random`` seeded from ``parts``."""
    return random.Random(int.from_bytes(_digest(*parts)[:8], "big"))
