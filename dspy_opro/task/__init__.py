"""The user's task: the program's predictors and their instructions, where the text sits, and the examples.

:mod:`~dspy_opro.task.programs` reads and sets a program's instructions and fingerprints programs, metrics and
datasets; :mod:`~dspy_opro.task.placement` realises ``instruction_pos`` in a predictor's signature;
:mod:`~dspy_opro.task.data` checks the trainset and valset against the program before any LM call and keeps the
per-example facts the run reuses.

May import: :mod:`dspy_opro.compat` and :mod:`dspy_opro.state`; never the method, the scoring, the record or an
extension.
"""
