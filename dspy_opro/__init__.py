"""dspy-opro: OPRO (Optimization by PROmpting, Yang et al., ICLR 2024) as a DSPy optimizer."""

from dspy_opro.compat import configure_loggers
from dspy_opro.errors import (
    EmptyResponseError,
    FatalLMError,
    LogDirError,
    MetricError,
    OPRORunError,
    ProgramError,
    RunInProgressError,
    StateFileError,
)
from dspy_opro.record.state import RunState
from dspy_opro.teleprompter import OPRO, OPROTeleprompter

__version__ = "0.1.0"

# Our log lines go through DSPy's logging stream, so dspy.disable_logging() silences them too.
configure_loggers(__name__)

__all__ = [
    "OPRO",
    "EmptyResponseError",
    "FatalLMError",
    "LogDirError",
    "MetricError",
    "OPROTeleprompter",
    "OPRORunError",
    "ProgramError",
    "RunInProgressError",
    "RunState",
    "StateFileError",
    "__version__",
]
