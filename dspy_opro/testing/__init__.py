"""Offline testing aids: a simulated OpenAI-compatible endpoint and a deterministic simulated model.

Nothing here imports the rest of ``dspy_opro``.
"""

from dspy_opro.testing.server import FaultConfig, RequestRecord, SimulatedEndpoint
from dspy_opro.testing.simulated import (
    TRAITS,
    Trait,
    answers_correctly,
    arithmetic_tool,
    instruction_quality,
    simulated_dataset,
    simulated_metric,
    simulated_metric_with_feedback,
    simulated_reply,
    solve_question,
)

__all__ = [
    "TRAITS",
    "FaultConfig",
    "RequestRecord",
    "SimulatedEndpoint",
    "Trait",
    "answers_correctly",
    "arithmetic_tool",
    "instruction_quality",
    "simulated_dataset",
    "simulated_metric",
    "simulated_metric_with_feedback",
    "simulated_reply",
    "solve_question",
]
