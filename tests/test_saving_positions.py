"""A compiled program through DSPy's JSON ``save``/``load``, for every ``instruction_pos``: the reloaded program sends
the task model what the compiled one sends (checked at the simulated endpoint), and no field of a fresh program is
shifted. ``Q_end`` keeps its text beside the signature's state; :func:`dspy_opro.load_program` puts it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dspy
import pytest

from dspy_opro import OPROTeleprompter, load_program
from dspy_opro.task.placement import QEndPredict
from dspy_opro.task.programs import with_instructions
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric

pytestmark = pytest.mark.compat  # Predict.load_state's signature differs between DSPy 3.1, 3.2 and 3.4

POSITIONS = [("Q_begin", False), ("before_Q", True), ("Q_end", False)]
PROGRAMS = {
    "predict": lambda: dspy.Predict(dspy.Signature("question -> answer", "Solve the math word problem.")),
    "chain_of_thought": lambda: dspy.ChainOfThought(dspy.Signature("question -> answer", "Solve it.")),
}


def _compile(endpoint: SimulatedEndpoint, program: dspy.Module, position: str, include_qa: bool) -> dspy.Module:
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/optimizer"),
                                 task_model=endpoint.lm(), num_steps=1, num_candidates=2, num_threads=1,
                                 instruction_pos=position, include_qa=include_qa, display_progress=False)
    return optimizer.compile(program, trainset=simulated_dataset(3))


def _task_prompt(endpoint: SimulatedEndpoint, program: dspy.Module, question: str) -> list[Any]:
    endpoint.reset_log()
    with dspy.context(lm=endpoint.lm()):
        program(question=question)
    return [r.messages for r in endpoint.requests if r.kind == "task"]


def _descriptions(program: dspy.Module) -> dict[str, list[str]]:
    return {name: [field.json_schema_extra["desc"] for field in predictor.signature.fields.values()]
            for name, predictor in program.named_predictors()}


@pytest.mark.parametrize("kind", sorted(PROGRAMS))
@pytest.mark.parametrize(("position", "include_qa"), POSITIONS)
def test_a_json_round_trip_sends_the_task_model_what_the_compiled_program_sends(
        tmp_path: Path, kind: str, position: str, include_qa: bool) -> None:
    question = simulated_dataset(5)[4].question
    with SimulatedEndpoint() as endpoint:
        compiled = _compile(endpoint, PROGRAMS[kind](), position, include_qa)
        compiled.save(str(tmp_path / "compiled.json"))
        expected = _task_prompt(endpoint, compiled, question)
        plain = PROGRAMS[kind]()
        plain.load(str(tmp_path / "compiled.json"))
        loaded = load_program(PROGRAMS[kind](), str(tmp_path / "compiled.json"))
        assert _task_prompt(endpoint, loaded, question) == expected
        # DSPy's own load: every field keeps its own description (nothing shifted) ...
        assert _descriptions(plain) == _descriptions(PROGRAMS[kind]())
        plain_prompt = _task_prompt(endpoint, plain, question)
    assert len(expected) == 1
    if position == "Q_end":  # ... and only the text after the inputs is missing
        record = compiled.opro_run
        selected = next(c for c in record.candidates if c.id == record.selection.candidate_id)
        text = selected.instruction or next(iter(selected.instructions.values()))
        assert f"[[ ## instruction ## ]]\n{text}\n\n" in expected[0][1]["content"]
        assert plain_prompt[0][1]["content"] == expected[0][1]["content"].replace(
            f"[[ ## instruction ## ]]\n{text}\n\n", "")
    else:
        assert plain_prompt == expected
    # Saved again, the reloaded program writes the same file (metadata aside).
    loaded.save(str(tmp_path / "again.json"))
    first, again = (json.loads((tmp_path / name).read_text()) for name in ("compiled.json", "again.json"))
    assert {k: v for k, v in again.items() if k != "metadata"} == {k: v for k, v in first.items() if k != "metadata"}


def test_a_q_end_state_file_holds_the_fresh_signatures_fields_and_the_text_beside_them(tmp_path: Path) -> None:
    program = dspy.Predict("question -> answer")
    program.demos = [dspy.Example(question="q", answer="a")]
    placed = with_instructions(program, {"self": "Check twice."}, instruction_pos="Q_end")
    assert type(placed) is QEndPredict and type(program) is dspy.Predict
    placed.save(str(tmp_path / "p.json"))
    state = json.loads((tmp_path / "p.json").read_text())
    assert state["signature"] == {
        "instructions": "Given the fields `question`, produce the fields `answer`.",
        "fields": [{"prefix": "Question:", "description": "${question}"},
                   {"prefix": "Answer:", "description": "${answer}"}]}
    assert state["opro_after_inputs"] == {"field": "instruction", "text": "Check twice."}
    assert state["demos"] == [{"question": "q", "answer": "a"}]
    # The compiled program itself (its predictor already has the field) loads the file back unchanged.
    placed.load(str(tmp_path / "p.json"))
    assert list(placed.signature.input_fields) == ["question", "instruction"]
    assert placed.signature.input_fields["instruction"].default == "Check twice."
    assert [dict(demo) for demo in placed.demos] == [{"question": "q", "answer": "a", "instruction": "Check twice."}]
    # The whole program (save_program=True) keeps its class, so it saves the same way again.
    placed.save(str(tmp_path / "whole"), save_program=True)
    whole = dspy.load(str(tmp_path / "whole"), allow_pickle=True)
    assert type(whole) is QEndPredict and whole.signature.input_fields["instruction"].default == "Check twice."
    # A predictor class of the user's own gets a subclass that saves the same way.
    class Mine(dspy.Predict):
        pass

    mine = with_instructions(Mine("question -> answer"), {"self": "Check twice."}, instruction_pos="Q_end")
    assert isinstance(mine, Mine) and type(mine).__name__ == "QEndMine"
    assert mine.dump_state()["opro_after_inputs"] == {"field": "instruction", "text": "Check twice."}


def test_a_malformed_or_clashing_q_end_entry_is_refused_naming_it(tmp_path: Path) -> None:
    placed = with_instructions(dspy.Predict("question -> answer"), {"self": "Check twice."}, instruction_pos="Q_end")
    placed.save(str(tmp_path / "p.json"))
    state = json.loads((tmp_path / "p.json").read_text())
    state["opro_after_inputs"] = {"field": "instruction", "text": 3}
    (tmp_path / "bad.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"^a saved 'opro_after_inputs' entry must hold the strings 'field' and "
                                         r"'text'; got \{'field': 'instruction', 'text': 3\}$"):
        load_program(dspy.Predict("question -> answer"), str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="^the saved Q_end field 'instruction' is already a field of the signature "
                                         "'question, instruction -> answer': load the file into the program it was "
                                         "compiled from$"):
        load_program(dspy.Predict("question, instruction -> answer"), str(tmp_path / "p.json"))


def test_a_q_end_program_compiled_again_with_q_end_searches_its_text_in_the_same_field(tmp_path: Path) -> None:
    with SimulatedEndpoint() as endpoint:
        first = _compile(endpoint, PROGRAMS["predict"](), "Q_end", False)
        text = first.signature.input_fields["instruction"].default
        second = _compile(endpoint, first, "Q_end", False)
        start = second.opro_run.candidates[0]
        second.save(str(tmp_path / "second.json"))
        loaded = load_program(PROGRAMS["predict"](), str(tmp_path / "second.json"))
        question = simulated_dataset(5)[4].question
        assert _task_prompt(endpoint, loaded, question) == _task_prompt(endpoint, second, question)
    # The start of the second run is the first run's text, and the program keeps one field for it.
    assert start.instructions == {"self": text}
    assert list(second.signature.input_fields) == ["question", "instruction"]
    assert second.signature.input_fields["instruction"].default == (
        next(c for c in second.opro_run.candidates if c.id == second.opro_run.selection.candidate_id).instructions[
            "self"])
    assert second.signature.instructions == "Given the fields `question`, produce the fields `answer`."
