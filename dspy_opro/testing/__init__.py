"""Offline runs and tests: a simulated OpenAI-compatible endpoint and the simulated task it serves.

What users import: :class:`SimulatedEndpoint` (the endpoint on 127.0.0.1, with its request log of
:class:`RequestRecord` and fault injection by :class:`FaultConfig`), the simulated arithmetic task to build runs
and tests on (:func:`simulated_dataset`, :func:`simulated_metric`, :func:`simulated_metric_with_feedback`,
:func:`arithmetic_tool`, and its answer key :func:`answers_correctly`, :func:`instruction_quality`,
:func:`solve_question`, :data:`TRAITS`), and :func:`simulated_reply` with its one hook, :data:`Responder` (see
:class:`SimulatedRequest`), for prompts the simulated model does not answer itself.

One job per module: ``server`` (the endpoint and its request log), ``transport`` (its HTTP plumbing), ``faults``
(fault injection), ``__main__`` (its command line, ``python -m dspy_opro.testing``), ``simulated`` (what a request
asks, routed to an answer), ``task_model`` (the simulated task: dataset, metric, instruction landscape, answers,
judge), ``proposer`` (the simulated optimizer model answering OPRO's meta-prompts, as every offline run's
optimizer model), ``adapter_prompts`` (reading and writing DSPy adapter prompts) and ``hashing`` (stable
pseudo-randomness). Beside the simulation, not imported here: ``local_model`` (a real model on 127.0.0.1:
SmolLM2-135M-Instruct served by llama-cpp-python, and a counting proxy; ``python -m dspy_opro.testing.local_model
serve``) and ``plain_adapter`` (a one-message adapter for models too small for DSPy's adapters).

Imports: the standard library, and ``dspy`` lazily (for ``dspy.Example``, ``dspy.Prediction`` and ``dspy.LM``);
nothing else of ``dspy_opro``, and ``dspy_opro`` imports nothing of it. The simulated COPRO, MIPROv2 and GEPA
proposers that tests and benchmarks use are responders in ``benchmarks/simulated_peers.py``, outside the library.
"""

from dspy_opro.testing.faults import FaultConfig
from dspy_opro.testing.server import RequestRecord, SimulatedEndpoint
from dspy_opro.testing.simulated import Responder, SimulatedRequest, simulated_reply
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
    "Responder",
    "SimulatedEndpoint",
    "SimulatedRequest",
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
