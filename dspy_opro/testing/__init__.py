"""Offline testing aids: a simulated OpenAI-compatible endpoint and a deterministic simulated model.

One job per module: ``server`` (the endpoint and its request log), ``transport`` (its HTTP plumbing), ``faults``
(fault injection), ``cli`` (its command line), ``simulated`` (what a request asks, routed to an answer),
``task_model`` (the simulated task: dataset, metric, instruction landscape, answers, judge), ``peers`` (simulated
OPRO/COPRO/MIPROv2/GEPA proposals), ``adapter_prompts`` (reading and writing DSPy adapter prompts) and ``hashing``
(stable pseudo-randomness). Nothing here imports the rest of ``dspy_opro``.
"""

from dspy_opro.testing.faults import FaultConfig
from dspy_opro.testing.server import RequestRecord, SimulatedEndpoint
from dspy_opro.testing.simulated import simulated_reply
from dspy_opro.testing.task_model import (
    TRAITS,
    Trait,
    answers_correctly,
    arithmetic_tool,
    instruction_quality,
    simulated_dataset,
    simulated_metric,
    simulated_metric_with_feedback,
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
