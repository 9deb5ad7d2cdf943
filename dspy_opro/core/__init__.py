"""The method: OPRO as the authors wrote it, as a DSPy optimizer, in the order a reader follows it.

:mod:`~dspy_opro.core.teleprompter` is DSPy's face (the settings, ``compile``, ``estimate``) and
:mod:`~dspy_opro.core.run` the step loop; beside them the authors' port (:mod:`~dspy_opro.core.templates`, their
strings; :mod:`~dspy_opro.core.meta_prompt`, the meta-prompt and the reply handling), what one step's meta-prompt
shows (:mod:`~dspy_opro.core.exemplars`, :mod:`~dspy_opro.core.initial`), what the optimizer proposes and what becomes
of it (:mod:`~dspy_opro.core.proposals`), what ``compile`` returns (:mod:`~dspy_opro.core.selection`), the settings'
checks, presets and fingerprint (:mod:`~dspy_opro.core.settings`) and the plan in
LM calls (:mod:`~dspy_opro.core.plan`).

May import: every other part of the package (the step loop asks :mod:`dspy_opro.scoring` to score and records into
:mod:`dspy_opro.record`); an extension's code only in :mod:`~dspy_opro.core.settings`, inside the function that builds
its policy. Nothing outside the core imports it but :mod:`dspy_opro` itself, and the selection policies' types.
"""
