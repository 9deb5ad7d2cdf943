"""dspy-opro: OPRO (Optimization by PROmpting, Yang et al., ICLR 2024) as a DSPy optimizer.

``OPROTeleprompter`` (alias ``OPRO``) is the optimizer; ``Racing``, ``HardDiverse`` and ``ValGate`` are the options of
the extensions beyond the authors, and ``PairwisePreference`` is label-free OPRO's metric (imported on first use).
``RunState`` is the run record a compiled program holds as ``opro_run``, ``OPRORunSummary`` what a saved one keeps of
it. ``load_program`` is DSPy's ``program.load`` that also puts an ``instruction_pos="Q_end"`` text back.
Importing the package configures nothing: log lines reach DSPy's logging stream only while a compile runs, and only
where logging is not configured otherwise.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from dspy_opro.core.teleprompter import OPRO, OPROTeleprompter
from dspy_opro.errors import (
    EmptyResponseError,
    FatalLMError,
    LogDirError,
    MetricError,
    OPRORunError,
    OptimizerUnavailableError,
    ProgramError,
    RunInProgressError,
    StateFileError,
)
from dspy_opro.extensions import HardDiverse, Racing, ValGate
from dspy_opro.record.summary import OPRORunSummary
from dspy_opro.state import CandidateStatus, RunState
from dspy_opro.task.placement import load_program

if TYPE_CHECKING:
    from dspy_opro.extensions.label_free import PairwisePreference

try:
    __version__ = version("dspy-opro")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "PairwisePreference":  # label-free OPRO's metric: its judge signature is built on first use
        return importlib.import_module("dspy_opro.extensions.label_free").PairwisePreference
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "OPRO",
    "CandidateStatus",
    "EmptyResponseError",
    "FatalLMError",
    "HardDiverse",
    "LogDirError",
    "MetricError",
    "OPROTeleprompter",
    "OPRORunError",
    "OptimizerUnavailableError",
    "OPRORunSummary",
    "PairwisePreference",
    "ProgramError",
    "Racing",
    "RunInProgressError",
    "RunState",
    "StateFileError",
    "ValGate",
    "__version__",
    "load_program",
]
