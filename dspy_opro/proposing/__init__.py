"""Proposing: what the optimizer model is shown, what it is asked, and what its replies become.

The paper's half of a step before scoring. :mod:`~dspy_opro.proposing.meta_prompt` is the authors' port (their
strings, meta-prompt builder, reply extraction, polishing and md5), checked byte for byte against their outputs.
Around it: the exemplar draw and the step's inputs (:mod:`~dspy_opro.proposing.exemplars`,
:mod:`~dspy_opro.proposing.step_inputs`, with the ``ExemplarPolicy`` seam), the initial instructions of step -1
(:mod:`~dspy_opro.proposing.initial`), the optimizer calls (:mod:`~dspy_opro.proposing.optimizer_calls`: ``n``,
single-choice requests, retries) and the triage of one step's replies (:mod:`~dspy_opro.proposing.triage`).

May import: :mod:`dspy_opro.errors`, :mod:`dspy_opro.compat`, :mod:`dspy_opro.checks`, :mod:`dspy_opro.record.state`,
:mod:`dspy_opro.task` and :mod:`dspy_opro.scoring.usage`; never the configuration, the step loop, the teleprompter
or an extension.
"""
