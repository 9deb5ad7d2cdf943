"""Argument checks: one rule for each kind of setting, shared by the configuration, the meta-prompt port and the DPP.

Python's ``bool`` is an ``int``, so a naive check would let ``num_steps=True`` through; every check here refuses a
bool where a number is meant and accepts numpy's numbers where Python's are. NaN is never in range. Each check
raises ``ValueError`` naming the setting, what it must be and the value it got, so that the message says how to fix
the call. A setting of the wrong kind altogether (a model that is neither a ``dspy.LM`` nor a string) is a
``TypeError``; those checks live beside the setting, in :mod:`dspy_opro.core.settings`.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Sequence
from typing import Any


def is_bool(value: Any) -> bool:
    """Whether ``value`` is a Python or numpy bool.

    numpy is looked up among the imported modules instead of imported: a numpy bool cannot exist before numpy is
    imported, and ``import dspy_opro`` stays cheap.
    """
    numpy = sys.modules.get("numpy")
    return isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))


def require_bool(name: str, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` is a bool."""
    if not is_bool(value):
        raise ValueError(f"{name} must be a bool (True or False); got {value!r}")


def require_int(name: str, value: Any, *, minimum: int, allow_none: bool = False, meaning: str = "") -> None:
    """Raise ``ValueError`` unless ``value`` is an integer >= ``minimum`` (or None, when allowed).

    Args:
        name: The setting's name, as the caller wrote it.
        value: What the caller passed.
        minimum: The smallest value allowed.
        allow_none: Whether None is allowed.
        meaning: A short note on what the value means, shown after the rule (e.g. ``" (0 means no limit)"``).
    """
    if value is None and allow_none:
        return
    if is_bool(value) or not isinstance(value, numbers.Integral) or value < minimum:
        or_none = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= {minimum}{meaning}{or_none}; got {value!r}")


def require_number(name: str, value: Any, *, low: float, high: float, allow_none: bool = False,
                   low_open: bool = False, high_open: bool = False, meaning: str = "") -> None:
    """Raise ``ValueError`` unless ``value`` is a real number in the interval from ``low`` to ``high``.

    Args:
        name: The setting's name.
        value: What the caller passed.
        low: The interval's lower end.
        high: The interval's upper end (``math.inf`` for none).
        allow_none: Whether None is allowed.
        low_open: Exclude ``low`` itself.
        high_open: Exclude ``high`` itself.
        meaning: A short note on what the value means, shown after the interval.
    """
    if value is None and allow_none:
        return
    if (is_bool(value) or not isinstance(value, numbers.Real) or math.isnan(number := float(value))
            or not (low < number if low_open else low <= number)
            or not (number < high if high_open else number <= high)):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        or_none = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a number in {interval}{meaning}{or_none}; got {value!r}")


def require_choice(name: str, value: Any, allowed: Sequence[str], *, meaning: str = "") -> None:
    """Raise ``ValueError`` unless ``value`` is one of the strings in ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(choice) for choice in allowed)
        raise ValueError(f"{name} must be one of {choices}{meaning}; got {value!r}")


__all__ = ["is_bool", "require_bool", "require_choice", "require_int", "require_number"]
