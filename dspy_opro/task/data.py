"""The examples of one run: checked once at ``compile``, with what each one can show in a meta-prompt.

:meth:`RunData.build` refuses what cannot work before any LM call: a program class instead of a program, a trainset
that is None or not a list, examples that are not ``dspy.Example`` (a dict names the conversion) or have no inputs,
input keys the program does not take (both sets named), an empty trainset, a program without predictors, unknown
target predictors, a missing valset where the configuration needs one, more exemplars than training examples, and a
budget too small to score the program as given. What the run then asks of the data per example (its label fields
for a predictor, whether its runs must record an exemplar answer, its question as the meta-prompt shows it) is
computed here once, not per evaluation.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dspy

from dspy_opro.compat import input_keys
from dspy_opro.state import Split
from dspy_opro.task.programs import output_fields, predictor_map


def check_examples(name: str, examples: Any) -> list[dspy.Example]:
    """The examples as a list, or an error naming the argument, the first bad example and the fix."""
    if examples is None:
        raise TypeError(f"{name} is None; pass {name}=[dspy.Example(question=..., answer=...).with_inputs('question'), "
                        "...] (a list of dspy.Example with their inputs set)")
    if isinstance(examples, str | bytes | dict | dspy.Example) or not isinstance(examples, Iterable):
        raise TypeError(f"{name} must be a list of dspy.Example; got a {type(examples).__name__}: pass "
                        f"{name}=[dspy.Example(...).with_inputs(...), ...]")
    examples = list(examples)
    for position, example in enumerate(examples):
        if isinstance(example, dict):
            keys = ", ".join(repr(key) for key in example)
            raise TypeError(
                f"{name}[{position}] is a dict, not a dspy.Example; convert each row with "
                f"dspy.Example(**row).with_inputs(...), naming its input keys among {keys}"
            )
        if not isinstance(example, dspy.Example):
            raise TypeError(f"{name}[{position}] is a {type(example).__name__}, not a dspy.Example; build it with "
                            "dspy.Example(question=..., answer=...).with_inputs('question')")
        if not input_keys(example):
            raise ValueError(
                f"{name}[{position}] has no input fields set; build examples with "
                "dspy.Example(...).with_inputs('question', ...)"
            )
    return examples


def check_program(program: Any) -> dspy.Module:
    """The program, or an error that says what was passed instead and how to pass a program."""
    if isinstance(program, type) and issubclass(program, dspy.Module):
        raise TypeError(f"compile() got the class {program.__name__}, not a program; pass an instance: "
                        f"compile({program.__name__}(...), trainset=...)")
    if not isinstance(program, dspy.Module):
        raise TypeError(f"compile() needs a dspy.Module to optimize; got {type(program).__name__}")
    if not callable(getattr(type(program), "forward", None)) and callable(getattr(type(program), "aforward", None)):
        name = type(program).__name__
        raise TypeError(
            f"the program {name} defines aforward but no forward: OPRO runs a program as dspy.Evaluate does, "
            f"{name}(**example.inputs()) on worker threads, which calls forward. Give {name} a forward (for example "
            "one that calls its predictors directly, or `return asyncio.run(self.aforward(**kwargs))`)")
    return program


def program_inputs(program: dspy.Module) -> tuple[set[str], set[str]] | None:
    """The input keys ``program(**inputs)`` requires and the ones it accepts; None when it cannot be told.

    A ``forward`` with named parameters says it; a predictor (``dspy.Predict``, ``dspy.ReAct``) or a module whose
    ``forward`` takes ``**kwargs`` around one predictor (``dspy.ChainOfThought``) takes its signature's inputs. A
    ``forward(**kwargs)`` over several predictors can route the keys anywhere, so it is not checked.
    """
    try:  # the class's function: reading ``program.forward`` makes DSPy warn against calling it directly
        forward = getattr(type(program), "forward")  # noqa: B009 - not on dspy.Module itself
        parameters = list(inspect.signature(forward).parameters.values())[1:]
    except (TypeError, ValueError, AttributeError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        signature = getattr(program, "signature", None)
        if signature is None:
            predictors = list(predictor_map(program).values())
            signature = getattr(predictors[0], "signature", None) if len(predictors) == 1 else None
        fields = getattr(signature, "input_fields", None)
        if not isinstance(fields, dict):
            return None
        # An input field with a default (a Q_end text) may be left out: DSPy fills it in.
        return {key for key, field in fields.items() if field.is_required()}, set(fields)
    named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return {p.name for p in named if p.default is p.empty}, {p.name for p in named}


def check_inputs_match(program: dspy.Module, name: str, examples: Sequence[dspy.Example]) -> None:
    """Refuse examples whose input keys the program does not take (every candidate would score 0)."""
    taken = program_inputs(program)
    if taken is None:
        return
    required, accepted = taken
    for position, example in enumerate(examples):
        keys = set(input_keys(example))
        if required <= keys and keys <= accepted:
            continue
        program_name = type(program).__name__
        raise ValueError(
            f"{name}[{position}]'s input keys {sorted(keys)} do not match the inputs of the program "
            f"{program_name}, {sorted(accepted)}: it would be called as {program_name}(**example.inputs()) and "
            f"fail on every example. Build the examples with .with_inputs({', '.join(map(repr, sorted(required)))})"
            " or rename the program's inputs"
        )


def _row_key(example: dspy.Example) -> str:
    """An example's fields as text, to find the same example in two datasets."""
    return repr(sorted((str(key), repr(value)) for key, value in example.items()))


NO_REFERENCE_NOTE = "(no reference answer available)"
"""The answer a meta-prompt shows for a problem with neither a usable label nor a usable answer of the program."""


def render_fields(values: dict[str, Any]) -> str:
    """Render field values as the meta-prompt shows them: a lone value as is, several as ``name: value`` lines."""
    if len(values) == 1:
        return str(next(iter(values.values())))
    return "\n".join(f"{name}: {value}" for name, value in values.items())


@dataclass
class RunData:
    """The trainset and valset of a run, the target predictors, and per-example facts the run reuses."""

    trainset: list[dspy.Example]
    valset: list[dspy.Example]
    targets: list[str]
    label_free: bool
    output_fields: dict[str, list[str]] = field(default_factory=dict)  # per target predictor
    label_keys: list[list[str]] = field(default_factory=list)  # per training example
    needs_answer: list[bool] = field(default_factory=list)  # per training example: its runs record an answer
    valset_given: bool = False  # a valset was passed (it may be empty)
    shared_with_trainset: int = 0  # validation examples equal to a training example

    @classmethod
    def build(cls, program: dspy.Module, trainset: Sequence[Any], valset: Sequence[Any] | None, *,
              predictors: Sequence[str] | None, label_free: bool, valset_needed_by: str | None, num_exemplars: int,
              max_metric_calls: int | None) -> RunData:
        """Check the program and the data against the run's settings; raise before any LM call.

        Args:
            program: The program to optimize.
            trainset: The training examples.
            valset: The validation examples, if any.
            predictors: The target predictors' names; None: all.
            label_free: Whether labels play no part (their fields are never shown).
            valset_needed_by: The setting that needs a valset (``"select='validation'"``), if one does.
            num_exemplars: Problems per meta-prompt.
            max_metric_calls: The evaluation budget, if any.
        """
        check_program(program)
        train = check_examples("trainset", trainset)
        val = check_examples("valset", valset) if valset is not None else []
        if not train:
            raise ValueError("trainset is empty; OPRO scores every instruction on the training examples")
        all_predictors = list(predictor_map(program))
        if not all_predictors:
            raise ValueError("the program has no predictors (dspy.Predict and friends) whose instructions to optimize")
        unknown = sorted(set(predictors or []) - set(all_predictors))
        if unknown:
            raise ValueError(f"unknown predictors {unknown}; the program's predictors are {all_predictors}")
        if valset_needed_by is not None and not val:
            raise ValueError(f"{valset_needed_by} needs a valset: pass compile(..., valset=...)")
        if num_exemplars > len(train):
            raise ValueError(f"num_exemplars={num_exemplars} exceeds the trainset size {len(train)}; lower it")
        if max_metric_calls is not None and max_metric_calls < len(train):
            raise ValueError(
                f"max_metric_calls={max_metric_calls} cannot even score the program as given on the "
                f"{len(train)} training examples; raise it or use a smaller trainset"
            )
        check_inputs_match(program, "trainset", train)
        check_inputs_match(program, "valset", val)
        targets = list(predictors or all_predictors)
        seen = {_row_key(example) for example in train}
        data = cls(trainset=train, valset=val, targets=targets, label_free=label_free,
                   output_fields={name: output_fields(program, name) for name in targets},
                   label_keys=[sorted(example.labels().keys()) for example in train], valset_given=valset is not None,
                   shared_with_trainset=sum(_row_key(example) in seen for example in val))
        # Examples whose labels miss some target predictor's outputs: their runs record an exemplar answer.
        data.needs_answer = [any(not data.label_fields(i, name) for name in targets) for i in range(len(train))]
        return data

    def notes(self) -> list[str]:
        """What the run says once before it starts, of data that is accepted but probably not what was meant."""
        notes = []
        if self.valset_given and not self.valset:
            notes.append("valset=[] is empty, so OPRO selects on training (the paper's setting); pass held-out "
                         "examples to select on them, or leave valset out")
        elif self.valset and self.shared_with_trainset == len(self.valset):
            notes.append(f"every one of the valset's {len(self.valset)} examples is also in the trainset: its scores "
                         "are not held out, so selecting on it cannot catch an instruction that overfits; pass "
                         "examples the trainset does not hold")
        elif self.shared_with_trainset:
            notes.append(f"{self.shared_with_trainset} of the valset's {len(self.valset)} examples are also in the "
                         "trainset: their validation scores are not held out")
        for name in [] if self.label_free else self.targets:
            missing = sum(not self.label_fields(i, name) for i in range(len(self.trainset)))
            if missing:
                notes.append(f"{missing} of {len(self.trainset)} training examples have no label for any output "
                             f"field of predictor {name!r} ({', '.join(self.output_fields[name])}): the meta-prompt "
                             "shows the program's own answer for them where the metric scored it 1, else "
                             f"{NO_REFERENCE_NOTE!r}")
        return notes

    def examples(self, split: Split) -> list[dspy.Example]:
        """The training (``"train"``) or validation (``"val"``) examples."""
        return self.trainset if split == "train" else self.valset

    def label_fields(self, index: int, predictor: str) -> list[str]:
        """The output fields of ``predictor`` that training example ``index`` has labels for (none when label-free)."""
        if self.label_free:
            return []
        labels = set(self.label_keys[index])
        return [name for name in self.output_fields[predictor] if name in labels]

    def answer_fields(self, index: int, split: Split) -> list[str] | None:
        """The label keys an evaluation uses to record an exemplar answer; None when it records none."""
        if split != "train" or not self.needs_answer[index]:
            return None
        return [] if self.label_free else self.label_keys[index]

    def question(self, index: int) -> str:
        """Training example ``index``'s inputs as the meta-prompt shows them."""
        return render_fields(dict(self.trainset[index].inputs().items()))


__all__ = [
    "NO_REFERENCE_NOTE",
    "RunData",
    "check_examples",
    "check_inputs_match",
    "check_program",
    "program_inputs",
    "render_fields",
]
