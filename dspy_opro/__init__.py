"""dspy-opro: OPRO (Optimization by PROmpting, Yang et al., ICLR 2024) as a DSPy optimizer."""

from dspy.utils.logging_utils import configure_dspy_loggers

from dspy_opro.errors import (
    EmptyResponseError,
    FatalLMError,
    LogDirError,
    MetricError,
    OPRORunError,
    ProgramError,
)
from dspy_opro.state import RunInProgressError, RunState, StateFileError
from dspy_opro.teleprompter import OPRO, OPROTeleprompter

__version__ = "0.1.0"

# Our log lines go through DSPy's logging stream, so dspy.disable_logging() silences them too.
configure_dspy_loggers(__name__)

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
