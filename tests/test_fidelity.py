"""The rows of docs/fidelity.md, each checked through the package's own code path.

The authors' end-to-end run (tests/golden/evolution_trace.json: 4 steps x 4 replies, a scripted optimizer and a
scripted scorer) is replayed through ``OPROTeleprompter`` with fake models that return the same replies and the
same scores; the triage is checked through :func:`dspy_opro.core.proposals.triage_replies` (which the run
calls), the exemplar draws through the run's own draw, the optimizer call through
:func:`dspy_opro.core.proposals.propose`, and ``instruction_pos`` through what the task model receives at
the simulated endpoint.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import dspy
import pytest

from dspy_opro import OPROTeleprompter
from dspy_opro.core.exemplars import draw_exemplar_indices
from dspy_opro.core.meta_prompt import MetaPromptOptions, instruction_md5
from dspy_opro.core.proposals import propose, triage_replies
from dspy_opro.core.settings import resolved_search
from dspy_opro.scoring.usage import UsageMeter
from dspy_opro.testing import SimulatedEndpoint, simulated_dataset, simulated_metric
from tests.fakes import (
    chat_reply,
    field_value,
    instruction_of,
    make_lm,
    scripted_optimizer,
    toy_task_reply,
    user_text,
)

TRACE: dict[str, Any] = json.loads((Path(__file__).parent / "golden" / "evolution_trace.json").read_text())
CONFIG = TRACE["config"]
PER_STEP = CONFIG["num_generated_instructions_in_each_step"]
STEPS = CONFIG["num_search_steps"]
REPLIES = [call["reply"] for call in TRACE["optimizer_calls"]]
ROWS = TRACE["data"]["questions_and_answers"]
START = TRACE["initial_instructions"][0]
AUTHORS_OPTIONS = MetaPromptOptions(optimizer_family="gpt", instruction_pos="Q_begin",
                                    meta_prompt_type="both_instructions_and_exemplars")
AUTHORS_CHARS = 500


def _step_replies(step: int) -> list[str]:
    return REPLIES[step * PER_STEP:(step + 1) * PER_STEP]


def _authors_scored(step: int) -> list[str]:
    return sorted(ins for ins, _, s in TRACE["old_instructions_and_scores"] if s == step)


# --------------------------------------------------------------------------------------------------------------
# Reply triage: extraction, polishing, md5 de-duplication and the filters
# --------------------------------------------------------------------------------------------------------------


def test_trace_has_16_replies_4_steps_of_4() -> None:
    assert (STEPS, PER_STEP, len(REPLIES)) == (4, 4, 16)


def test_triage_of_the_trace_replies_without_registering_the_start_is_the_authors() -> None:
    """With the authors' seen-set (starting instruction not registered, Q4) the package's triage keeps what they
    scored, except the empty instruction (skipped here, Q6) and "Use 2 steps." (their gsm8k digit filter, Q9)."""
    seen: set[str] = set()
    fates, instructions = [], []
    for step in range(STEPS):
        verdicts = triage_replies(_step_replies(step), seen, AUTHORS_OPTIONS, max_instruction_chars=AUTHORS_CHARS)
        seen |= {v.md5 for v in verdicts if v.md5}
        fates.append([v.fate for v in verdicts])
        instructions += [v.instruction for v in verdicts]
        new = sorted(v.instruction for v in verdicts if v.fate == "new")
        expected = sorted({*_authors_scored(step)} - {""} | ({"Use 2 steps."} if step == 0 else set()))
        assert new == expected
    assert fates == [
        ["new", "new", "new", "duplicate"],
        ["new", "duplicate", "contains_ins", "too_long"],
        ["new", "new", "empty", "new"],
        ["duplicate", "duplicate", "duplicate", "duplicate"],
    ]
    # Extraction and polishing give the authors' raw record, reply for reply.
    assert instructions == [ins for ins, _, s in TRACE["old_instructions_and_scores_raw"] if s >= 0]


def test_ins_filter_is_case_sensitive_and_skips_what_the_authors_skipped() -> None:
    verdicts = triage_replies(["<INS>Write out each <INS> carefully.</INS>", "<INS>Read the INSTRUCTIONS.</INS>",
                               "<INS>Read the instructions.</INS>"], set(), AUTHORS_OPTIONS,
                              max_instruction_chars=AUTHORS_CHARS)
    assert [(v.instruction, v.fate) for v in verdicts] == [
        ("Write out each <INS> carefully.", "contains_ins"),
        ("Read the INSTRUCTIONS.", "contains_ins"),
        ("Read the instructions.", "new"),
    ]
    assert verdicts[0].reason == "contains 'INS' (a leftover tag)"
    # The authors skipped it too: it has no score in their raw record.
    assert ["Write out each <INS> carefully.", None, 1] in TRACE["old_instructions_and_scores_raw"]


def test_registering_the_starting_instruction_makes_its_regeneration_a_duplicate() -> None:
    verdicts = triage_replies(_step_replies(1), {instruction_md5(START)}, AUTHORS_OPTIONS,
                              max_instruction_chars=AUTHORS_CHARS)
    assert [v.fate for v in verdicts][:1] == ["duplicate"]
    assert [ins for ins, _, _ in TRACE["old_instructions_and_scores"]].count(START) == 2  # the authors' Q4


def test_a_skipped_instruction_is_registered_so_its_repeat_is_a_duplicate() -> None:
    verdicts = triage_replies(["<INS></INS>", "<INS> </INS>", "<INS>Write <INS>.</INS>", "<INS>Write <INS>.</INS>"],
                              set(), AUTHORS_OPTIONS, max_instruction_chars=AUTHORS_CHARS)
    assert [v.fate for v in verdicts] == ["empty", "duplicate", "contains_ins", "duplicate"]


# --------------------------------------------------------------------------------------------------------------
# The authors' run replayed through OPROTeleprompter
# --------------------------------------------------------------------------------------------------------------


def _trace_trainset() -> list[dspy.Example]:
    return [dspy.Example(question=str(ROWS[i][0]), answer=str(ROWS[i][1])).with_inputs("question")
            for i in TRACE["data"]["train_index"]]


def _scripted_task(request) -> str:
    """The authors' scripted scorer: an instruction with c correct answers gets the first c training rows right."""
    question = field_value(user_text(request), "question")
    index = next(i for i, row in enumerate(ROWS) if str(row[0]) == question)
    correct = TRACE["scripted_train_correct_out_of_10"].get(instruction_of(request), 0)
    return chat_reply(answer=str(ROWS[index][1]) if index < correct else "wrong")


def _replay() -> tuple[dspy.Module, Any, Any]:
    task_lm, task_engine = make_lm(_scripted_task)
    opt_lm, opt_engine = make_lm(scripted_optimizer(REPLIES))
    optimizer = OPROTeleprompter(
        lambda example, prediction, trace=None: float(prediction.answer == example.answer),
        prompt_model=opt_lm, task_model=task_lm, num_steps=STEPS, num_candidates=PER_STEP,
        num_exemplars=CONFIG["num_few_shot_questions_for_instruction_refinement"],
        score_threshold=CONFIG["old_instruction_score_threshold"], num_score_buckets=CONFIG["num_score_buckets"],
        max_num_instructions=CONFIG["max_num_instructions"], instruction_pos=CONFIG["instruction_pos"],
        include_qa=CONFIG["include_qa"], max_instruction_chars=500, num_threads=1)
    compiled = optimizer.compile(dspy.Predict(dspy.Signature("question -> answer", START)), trainset=_trace_trainset())
    return compiled, task_engine, opt_engine


DUPLICATE_START_BLOCK = f"\ntext:\n{START}\nscore:\n60\n"


def test_replayed_run_builds_the_authors_meta_prompts() -> None:
    """Steps 0 and 1 are byte-identical; from step 2 on the authors' prompt shows the regenerated starting
    instruction a second time (Q4), and that one block is the only difference."""
    compiled, task_engine, opt_engine = _replay()
    prompts = [user_text(request) for request in opt_engine.requests]
    assert len(prompts) == STEPS * PER_STEP  # the authors' 4 sequential calls per step
    authors = [prompt for prompt, _ in TRACE["meta_prompts"]]
    for step in range(STEPS):
        assert prompts[step * PER_STEP:(step + 1) * PER_STEP] == [prompts[step * PER_STEP]] * PER_STEP
        ours = prompts[step * PER_STEP]
        if step < 2:
            assert ours == authors[step]
        else:
            assert authors[step].count(DUPLICATE_START_BLOCK) == 2
            assert ours == authors[step].replace(DUPLICATE_START_BLOCK, "", 1)
    record = compiled.opro_run
    assert [s.exemplar_indices for s in record.steps] == [TRACE["few_shot_index_list_by_step"][str(s)]
                                                          for s in range(STEPS)]
    assert [[r.fate for r in s.replies] for s in record.steps] == [
        ["new", "new", "new", "duplicate"],
        ["duplicate", "duplicate", "contains_ins", "too_long"],  # the start is registered here (Q4)
        ["new", "new", "empty", "new"],
        ["duplicate", "duplicate", "duplicate", "duplicate"],
    ]
    # Each scored instruction ran once on each of the 10 training rows: the start, 3 at step 0, 3 at step 2.
    assert len(task_engine.requests) == 10 * 7
    # The best training score over the history (the paper's reporting practice) is the authors' best entry.
    best = max(TRACE["old_instructions_and_scores"], key=lambda entry: entry[1])
    assert compiled.signature.instructions == best[0] == "Take a deep breath and work on this problem step-by-step."


# --------------------------------------------------------------------------------------------------------------
# Exemplar draws inside the run
# --------------------------------------------------------------------------------------------------------------


class _StrictFails(dspy.Module):
    """A program that raises on "item 0" once its instruction says "Strict"."""

    def __init__(self) -> None:
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        if "Strict" in self.predict.signature.instructions and question == "item 0":
            raise ValueError("cannot handle item 0")
        return self.predict(question=question)


@pytest.mark.parametrize("criteria", ["random", "constant"])
def test_run_keeps_labelled_examples_the_best_program_failed_in_the_pool(criteria: str) -> None:
    """Labelled examples stay in the pool whatever the best program did on them, so the draw is the authors' at
    every step (and "constant" repeats the step-0 draw), even after the best program raises on item 0."""
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, _ = make_lm(scripted_optimizer(["<INS>Strict: better better better.</INS>", "<INS>Better.</INS>"]))
    trainset = [dspy.Example(question=f"item {i}", answer=f"a{i}").with_inputs("question") for i in range(6)]
    optimizer = OPROTeleprompter(lambda example, prediction, trace=None: float(prediction.answer == example.answer),
                                 prompt_model=opt_lm, task_model=task_lm, num_steps=3, num_candidates=1,
                                 exemplar_selection=criteria, num_threads=1)
    record = optimizer.compile(_StrictFails(), trainset=trainset).opro_run
    assert record.candidates[1].instruction == "Strict: better better better."
    assert (record.candidates[1].failed, record.candidates[1].score) == ([0], 2 / 6)
    draw_step = {"random": lambda step: step, "constant": lambda step: 0}[criteria]
    assert [s.exemplar_indices for s in record.steps] == [
        draw_exemplar_indices(list(range(6)), 3, draw_step(step)) for step in range(3)
    ]
    if criteria == "constant":
        assert record.steps[0].exemplar_indices == record.steps[1].exemplar_indices == [1, 2, 5]


# --------------------------------------------------------------------------------------------------------------
# The optimizer call
# --------------------------------------------------------------------------------------------------------------


def test_propose_sends_the_meta_prompt_verbatim_once_per_candidate() -> None:
    meta_prompt = TRACE["meta_prompts"][0][0]
    lm, engine = make_lm(scripted_optimizer([f"<INS>Idea {i}.</INS>" for i in range(8)]), model="anthropic/fake")
    proposals = propose(lm, meta_prompt, num_candidates=8, step=0, seed=0, temperature=1.0, max_tokens=512,
                        num_threads=1, take_usage=UsageMeter().take)
    assert len(engine.requests) == 8
    assert all(r.system is None and len(r.messages) == 1 and r.messages[0].role == "user"
               and user_text(r) == meta_prompt for r in engine.requests)
    assert [(r.config.temperature, r.config.max_tokens) for r in engine.requests] == [(1.0, 512)] * 8
    assert proposals.replies == [f"<INS>Idea {i}.</INS>" for i in range(8)]


def test_propose_asks_an_openai_compatible_endpoint_once_with_n() -> None:
    meta_prompt = TRACE["meta_prompts"][0][0]
    with SimulatedEndpoint() as endpoint:
        proposals = propose(endpoint.lm("openai/optimizer"), meta_prompt, num_candidates=8, step=0, seed=0,
                            temperature=1.0, max_tokens=512, num_threads=1, take_usage=UsageMeter().take)
        requests = endpoint.requests
    assert [(r.kind, r.n, r.status) for r in requests] == [("opro", 8, 200)]
    assert requests[0].messages == [{"role": "user", "content": meta_prompt}]
    assert len(proposals.replies) == 8


# --------------------------------------------------------------------------------------------------------------
# instruction_pos: where the task model receives the text
# --------------------------------------------------------------------------------------------------------------


def _compile_at_endpoint(endpoint: SimulatedEndpoint, **options: Any) -> dspy.Module:
    optimizer = OPROTeleprompter(simulated_metric, prompt_model=endpoint.lm("openai/optimizer"),
                                 task_model=endpoint.lm(), num_steps=1, num_candidates=2, num_threads=1, **options)
    program = dspy.Predict(dspy.Signature("question -> answer", "Solve the math word problem."))
    return optimizer.compile(program, trainset=simulated_dataset(3))


def _task_messages(endpoint: SimulatedEndpoint) -> list[tuple[str, str]]:
    return [(r.messages[0]["content"], r.messages[1]["content"]) for r in endpoint.requests if r.kind == "task"]


def test_q_end_puts_the_text_after_the_question(caplog: pytest.LogCaptureFixture) -> None:
    with SimulatedEndpoint() as endpoint, caplog.at_level(logging.WARNING, logger="dspy_opro.core.run"):
        compiled = _compile_at_endpoint(endpoint, instruction_pos="Q_end")
        # Saving: the user is told at once how a JSON state file loads back whole (tests/test_saving_positions.py).
        assert [r.getMessage() for r in caplog.records if "load_program" in r.getMessage()] == [
            "instruction_pos='Q_end': the returned program carries the instruction in an extra input field after the "
            "inputs, which a fresh program loading its JSON save with DSPy's load() lacks; load it with "
            "dspy_opro.load_program(program, 'x.json') instead"]
        meta_prompt = next(r.messages[0]["content"] for r in endpoint.requests if r.kind == "opro")
        tasks = _task_messages(endpoint)
        texts = [c.instruction or c.instructions["self"] for c in compiled.opro_run.candidates
                 if c.status == "scored"]
        question = simulated_dataset(3)[0].question
        endpoint.reset_log()
        with dspy.context(lm=endpoint.lm()):
            compiled(question=question)
        system, user = _task_messages(endpoint)[0]
    # The meta-prompt shows the problems with <INS> after the question ...
    assert "\nProblem:\n" in meta_prompt and "\n<INS>\n\nGround truth answer:\n" in meta_prompt
    # ... and every training run carries its text after the question, in the user message, not in the system one.
    assert len(texts) == 3 and len(tasks) == 3 * 3
    placed = []
    for system_text, user_text_ in tasks:
        match = re.fullmatch(r"\[\[ ## question ## \]\]\n(.+?)\n\n\[\[ ## instruction ## \]\]\n(.+?)\n\n"
                             r"Respond with the corresponding output fields, .*", user_text_, re.S)
        assert match is not None
        placed.append(match.group(2))
        assert system_text.endswith("your objective is: \n        Given the fields `question`, produce the fields "
                                    "`answer`.")
        assert match.group(2) not in system_text
    assert sorted(set(placed)) == sorted(texts) and "Solve the math word problem." in placed
    # The returned program places its text the same way.
    chosen = compiled.opro_run.candidates[compiled.opro_run.selection.candidate_id]
    assert user.startswith(f"[[ ## question ## ]]\n{question}\n\n[[ ## instruction ## ]]\n"
                           f"{chosen.instructions['self']}\n\nRespond with")


@pytest.mark.parametrize(("position", "include_qa"), [("Q_begin", False), ("before_Q", True)])
def test_q_begin_and_before_q_put_the_text_before_the_question(position: str, include_qa: bool) -> None:
    with SimulatedEndpoint() as endpoint:
        compiled = _compile_at_endpoint(endpoint, instruction_pos=position, include_qa=include_qa)
        tasks = _task_messages(endpoint)
    texts = {c.instruction or c.instructions["self"] for c in compiled.opro_run.candidates if c.status == "scored"}
    assert len(tasks) == 3 * len(texts)
    placed = set()
    for system_text, user_text_ in tasks:
        objective = system_text.split("your objective is: \n        ", 1)[1]
        placed.add(objective)
        assert user_text_.startswith("[[ ## question ## ]]\n") and objective not in user_text_
        assert "[[ ## instruction ## ]]" not in user_text_
    assert placed == texts


def test_a_begin_is_refused_before_any_model_call() -> None:
    with SimulatedEndpoint() as endpoint:
        with pytest.raises(ValueError, match="cannot start the answer with a given text.*Use instruction_pos='Q_end'"):
            _compile_at_endpoint(endpoint, instruction_pos="A_begin", include_qa=True)
        assert endpoint.requests == []


def test_q_end_demos_carry_the_text_and_the_field_name_avoids_a_clash() -> None:
    from dspy_opro.task.programs import with_instructions

    program = dspy.Predict("question, instruction -> answer")
    program.demos = [dspy.Example(question="q", instruction="i", answer="a")]
    placed = with_instructions(program, {"self": "Check twice."}, instruction_pos="Q_end")
    assert list(placed.signature.input_fields) == ["question", "instruction", "opro_instruction"]
    assert placed.signature.input_fields["opro_instruction"].default == "Check twice."
    assert placed.demos[0].opro_instruction == "Check twice." and "opro_instruction" not in program.demos[0]
    assert list(program.signature.input_fields) == ["question", "instruction"]


# --------------------------------------------------------------------------------------------------------------
# Defaults that differ from the authors' settings
# --------------------------------------------------------------------------------------------------------------


def test_defaults_that_differ_from_the_authors_reach_the_run() -> None:
    """10 steps (theirs 200), threshold 0 (theirs 0.3 with GPT scorers), max_tokens 1024 (their GPT optimizer 512),
    no length limit (theirs 500 characters)."""
    task_lm, _ = make_lm(toy_task_reply)
    opt_lm, opt_engine = make_lm(scripted_optimizer(["<INS>" + "Be better. " * 60 + "</INS>"]))
    optimizer = OPROTeleprompter(lambda example, prediction, trace=None: float(prediction.answer == example.answer),
                                 prompt_model=opt_lm, task_model=task_lm, num_candidates=1, num_threads=1)
    # num_steps stays None when not given, meaning the authors' 10 steps (the run resolves it).
    assert (optimizer.num_steps, resolved_search(optimizer, 3)[0], optimizer.score_threshold, optimizer.max_tokens,
            optimizer.max_instruction_chars) == (None, 10, 0.0, 1024, None)
    trainset = [dspy.Example(question=f"item {i}", answer=f"a{i}").with_inputs("question") for i in range(3)]
    record = optimizer.compile(dspy.Predict("question -> answer"), trainset=trainset).opro_run
    assert len(record.steps) == len(opt_engine.requests) == 10
    assert {r.config.max_tokens for r in opt_engine.requests} == {1024}
    long_instruction = record.candidates[1].instruction
    assert len(long_instruction) == 659 and record.candidates[1].status == "scored"
    # A zero-score instruction stays in the meta-prompt: the start scored 0 and is shown at every step.
    assert all("score:\n0\n" in user_text(r) for r in opt_engine.requests)


# --------------------------------------------------------------------------------------------------------------
# The fidelity page names a test on every row
# --------------------------------------------------------------------------------------------------------------

TEST_REFERENCE = re.compile(r"`(tests/test_\w+\.py)::(\w+)`")


def _table_rows(section: str) -> list[str]:
    page = (Path(__file__).parent.parent / "docs" / "fidelity.md").read_text(encoding="utf-8")
    body = page.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ")]
    return rows[1:]  # the header row (the separator row starts with "| ---")


@pytest.mark.parametrize("section", ["What is identical", "What differs, and why", "What is not ported"])
def test_every_row_of_the_fidelity_page_names_a_test_that_exists(section: str) -> None:
    rows = [row for row in _table_rows(section) if not row.startswith("| ---")]
    assert rows
    root = Path(__file__).parent.parent
    for row in rows:
        references = TEST_REFERENCE.findall(row)
        assert references, f"no test named in the row {row[:80]!r}"
        for path, name in references:
            source = (root / path).read_text(encoding="utf-8")
            assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} does not exist"
