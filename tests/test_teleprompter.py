"""The OPRO loop over DSPy programs, with fake LMs: exact call counts, meta-prompts and selection."""

import logging
from collections import Counter
from pathlib import Path

import dspy
import pytest
from dspy.lm15 import AuthError, ServerError

from dspy_opro import OPRO, OPROTeleprompter
from dspy_opro.core.exemplars import draw_exemplar_indices
from dspy_opro.core.meta_prompt import gen_meta_prompt
from dspy_opro.errors import FatalLMError, MetricError, OPRORunError
from tests.fakes import (
    chat_reply,
    field_value,
    instruction_of,
    make_lm,
    output_field_names,
    scripted_optimizer,
    skill,
    toy_dataset,
    toy_metric,
    toy_task_reply,
    user_text,
)

START = "Given the fields `question`, produce the fields `answer`."


def optimizer_texts(engine) -> list[str]:
    return [user_text(request) for request in engine.requests]


def task_calls_by_instruction(engine) -> Counter:
    return Counter(instruction_of(request) for request in engine.requests)


def run(replies, *, trainset=None, valset=None, program=None, task=toy_task_reply, **kwargs):
    task_lm, task_engine = make_lm(task)
    opt_lm, opt_engine = make_lm(scripted_optimizer(replies))
    settings = {"num_steps": 2, "num_candidates": 4, "num_threads": 1, **kwargs}
    optimizer = OPROTeleprompter(toy_metric if "metric" not in settings else settings.pop("metric"),
                                 prompt_model=opt_lm, task_model=task_lm, **settings)
    student = program or dspy.Predict("question -> answer")
    compiled = optimizer.compile(student, trainset=trainset or toy_dataset(6), valset=valset)
    return compiled, student, task_engine, opt_engine


STEP0 = ["<INS>Do better.</INS>", "<INS>Do better.</INS>", "Sure: <INS>Be better and better.</INS>", " do better. "]
STEP1 = ["<INS>Better, better, better.</INS>", "<INS>Do better.</INS>", "<INS></INS>",
         "<INS>Be better and better.</INS>"]


def test_exact_calls_meta_prompts_and_dedup():
    compiled, student, task_engine, opt_engine = run(STEP0 + STEP1)
    # num_candidates optimizer calls per step, each sending the meta-prompt verbatim.
    texts = optimizer_texts(opt_engine)
    assert len(texts) == 8
    assert all(len(request.messages) == 1 and request.system is None for request in opt_engine.requests)
    assert all(request.config.temperature == 1.0 for request in opt_engine.requests)

    def exemplars(step):
        return [(f"item {i}", f"a{i}") for i in draw_exemplar_indices(range(6), 3, step)]

    expected0 = gen_meta_prompt([(START, 0.0, -1)], exemplars(0))
    assert texts[:4] == [expected0] * 4
    history1 = [(START, 0.0, -1), ("Do better.", 1 / 6, 0), ("Be better and better.", 2 / 6, 0)]
    assert texts[4:] == [gen_meta_prompt(history1, exemplars(1))] * 4
    # Identical replies are scored once; each new instruction runs exactly once per training example.
    calls = task_calls_by_instruction(task_engine)
    assert calls == {START: 6, "Do better.": 6, "Be better and better.": 6, "Better, better, better.": 6}
    run_record = compiled.opro_run
    assert [r.fate for r in run_record.steps[0].replies] == ["new", "duplicate", "new", "duplicate"]
    assert [r.fate for r in run_record.steps[1].replies] == ["new", "duplicate", "empty", "duplicate"]
    # The best training score becomes the program; the student is untouched.
    assert compiled.signature.instructions == "Better, better, better."
    assert student.signature.instructions == START
    assert compiled is not student
    assert [c["score"] for c in compiled.candidate_programs] == [0.5, 2 / 6, 1 / 6, 0.0]
    assert compiled.candidate_programs[0]["instructions"] == {"self": "Better, better, better."}
    assert compiled.candidate_programs[0]["step"] == 1
    assert run_record.candidates[-1].status == "skipped" and run_record.candidates[-1].reason == "empty instruction"


def test_validation_selection_and_validation_never_in_meta_prompt():
    valset = toy_dataset(4, prefix="val")
    replies = ["<INS>Overfit better better better better better.</INS>", "<INS>Better better.</INS>",
               "<INS>Better.</INS>", "<INS>Better.</INS>"]
    compiled, _, task_engine, opt_engine = run(replies, valset=valset, num_steps=1, select="validation", top_k=2)
    overfit = "Overfit better better better better better."
    assert compiled.signature.instructions == "Better better."
    ranked = compiled.candidate_programs
    assert ranked[0]["instructions"]["self"] == overfit and ranked[0]["score"] == 1.0
    assert ranked[0]["val_score"] == 0.0 and ranked[1]["val_score"] == 0.5
    # top_k=2 on the valset: 4 evaluations each, on top of 6 x (1 + 3) training evaluations.
    assert len(task_engine.requests) == 6 * 4 + 4 * 2
    assert compiled.opro_run.selection.selected_by == "validation"
    texts = optimizer_texts(opt_engine)
    assert len(texts) == 4 and all("item " in text and "val " not in text for text in texts)


def test_select_train_is_the_paper_setting_one_argument_away():
    replies = ["<INS>Overfit better better better better better.</INS>", "<INS>Better better.</INS>"]
    compiled, *_ = run(replies, valset=toy_dataset(4, prefix="val"), num_steps=1, num_candidates=2, select="train")
    assert compiled.signature.instructions == "Overfit better better better better better."
    assert compiled.opro_run.selection.selected_by == "train"


def test_transport_failures_retry_once_then_unscored():
    def task(request):
        if "Flaky" in instruction_of(request):
            return ServerError("upstream exploded")
        return toy_task_reply(request)

    replies = ["<INS>Flaky better better.</INS>", "<INS>Better.</INS>"] * 2
    compiled, _, task_engine, opt_engine = run(replies, task=task, num_candidates=2)
    calls = task_calls_by_instruction(task_engine)
    assert calls["Flaky better better."] == 12  # every example tried twice
    flaky = next(c for c in compiled.opro_run.candidates if c.instruction == "Flaky better better.")
    assert flaky.status == "unscored" and "LM failures on 6 examples" in flaky.reason
    # An unscored instruction never appears in a meta-prompt; the step's scored one does.
    histories = [text.split("Below are some problems")[0] for text in optimizer_texts(opt_engine)]
    assert len(histories) == 4 and not any("Flaky" in text for text in histories)
    assert [("text:\nBetter.\n" in text) for text in histories] == [False, False, True, True]
    assert compiled.signature.instructions == "Better."


def test_auth_error_stops_the_run_with_state_saved(tmp_path):
    def task(request):
        if "Better" in instruction_of(request):
            return AuthError("invalid api key")
        return toy_task_reply(request)

    with pytest.raises(FatalLMError, match="API key"):
        run(["<INS>Better.</INS>"], task=task, num_steps=1, num_candidates=1, log_dir=tmp_path)
    saved = (tmp_path / "state.json").read_text()
    assert '"status":"scored"' in saved and "Better." in saved


def test_program_exceptions_score_failure_score():
    def task(request):
        if "Broken" in instruction_of(request):
            return "no fields here"
        return toy_task_reply(request)

    compiled, _, task_engine, _ = run(["<INS>Broken better.</INS>"], task=task, num_steps=1, num_candidates=1,
                                      failure_score=0.25)
    broken = compiled.opro_run.candidates[1]
    assert broken.status == "scored" and broken.score == 0.25 and broken.failed == list(range(6))


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        (lambda ex, pred, trace=None: 1 / 0, "ZeroDivisionError"),
        (lambda ex, pred, trace=None: None, "returned None"),
        (lambda ex, pred, trace=None: float("nan"), "returned NaN"),
        (lambda ex, pred, trace=None: 1.5, "outside"),
        (lambda ex, pred, trace=None: "yes", "not a number"),
    ],
)
def test_broken_metric_stops_with_the_example_named(metric, message):
    with pytest.raises(MetricError, match=rf"example 0 \(\{{'question': 'item 0'\}}\).*{message}.*max_errors=0"):
        run(["<INS>Better.</INS>"], metric=metric, num_steps=1, num_candidates=1, max_errors=0)


def test_metric_returning_prediction_and_bool():
    def metric(example, prediction, trace=None):
        return dspy.Prediction(score=toy_metric(example, prediction), feedback="ok")

    compiled, *_ = run(["<INS>Better better better.</INS>"], metric=metric, num_steps=1, num_candidates=1)
    assert compiled.opro_run.candidates[1].score == 0.5
    compiled, *_ = run(["<INS>Better better better.</INS>"], num_steps=1, num_candidates=1,
                       metric=lambda ex, pred, trace=None: pred.answer == ex.answer)
    assert compiled.opro_run.candidates[1].score == 0.5


def test_budget_left_no_room_for_validation_falls_back_to_train():
    compiled, _, task_engine, _ = run(["<INS>Better.</INS>"], num_steps=1, num_candidates=1, select="validation",
                                      valset=toy_dataset(4, prefix="val"), max_metric_calls=14)
    assert len(task_engine.requests) == 14
    assert compiled.opro_run.selection.selected_by == "train"
    assert "fell back" in compiled.opro_run.selection.reason
    assert compiled.signature.instructions == "Better."


def test_save_and_load_round_trip(tmp_path):
    compiled, *_ = run(["<INS>Better better.</INS>"], num_steps=1, num_candidates=1)
    path = tmp_path / "compiled.json"
    compiled.save(str(path))
    fresh = dspy.Predict("question -> answer")
    fresh.load(str(path))
    assert fresh.signature.instructions == "Better better."


def test_chain_of_thought():
    compiled, _, task_engine, _ = run(["<INS>Better better.</INS>"], program=dspy.ChainOfThought("question -> answer"),
                                      num_steps=1, num_candidates=1)
    assert compiled.predict.signature.instructions == "Better better."
    assert compiled.opro_run.candidates[1].score == 2 / 6


class Pipeline(dspy.Module):
    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("question -> draft")
        self.final = dspy.Predict("question, draft -> answer")

    def forward(self, question):
        draft = self.draft(question=question).draft
        return self.final(question=question, draft=draft)


def pipeline_reply(request):
    text = user_text(request)
    question = text.split("[[ ## question ## ]]\n", 1)[1].split("\n", 1)[0]
    instruction = instruction_of(request)
    if output_field_names(request) == ["answer"]:  # the final predictor: its own skill plus the draft's

        bonus = int((field_value(text, "draft") or "d0")[1:])
        index = int(question.split()[-1])
        return chat_reply(answer=f"a{index}" if index < skill(instruction) + bonus else "wrong")
    return chat_reply(draft=f"d{skill(instruction)}")


def test_two_predictor_pipeline_round_robin():
    replies = ["<INS>Draft better.</INS>"] * 2 + ["<INS>Answer better better.</INS>"] * 2
    compiled, student, task_engine, opt_engine = run(replies, program=Pipeline(), task=pipeline_reply,
                                                     num_candidates=2)
    steps = compiled.opro_run.steps
    assert [s.predictor for s in steps] == ["draft", "final"]
    assert compiled.draft.signature.instructions == "Draft better."
    assert compiled.final.signature.instructions == "Answer better better."
    assert compiled.candidate_programs[0]["score"] == 3 / 6
    # The step-1 candidate keeps the best draft instruction from step 0.
    step1 = next(c for c in compiled.opro_run.candidates if c.step == 1)
    assert step1.instructions == {"draft": "Draft better.", "final": "Answer better better."}
    # Each predictor's meta-prompt shows its own history only.
    texts = optimizer_texts(opt_engine)
    assert "Draft better." not in texts[2] and "Given the fields `question`, `draft`" in texts[2]
    assert student.draft.signature.instructions == "Given the fields `question`, produce the fields `draft`."


def lookup(question: str) -> str:
    """Look up the answer to a question."""
    return "a" + question.split()[-1]


def agent_reply(request):
    text = user_text(request)
    instruction = instruction_of(request)
    if "next_tool_name" in output_field_names(request):
        if "better" in instruction.lower() and "observation_0" not in text:
            question = text.split("[[ ## question ## ]]\n", 1)[1].split("\n", 1)[0]
            return chat_reply(next_thought="Look it up.", next_tool_name="lookup",
                              next_tool_args=f'{{"question": "{question}"}}')
        return chat_reply(next_thought="Done.", next_tool_name="finish", next_tool_args="{}")
    observation = text.split("[[ ## observation_0 ## ]]", 1)[1].split("\n\n", 1)[0] if "observation_0" in text else ""
    answer = observation.strip().split()[-1] if observation.strip() else "wrong"
    return chat_reply(reasoning="Read the observation.", answer=answer)


def test_react_agent_scored_by_running_it():
    agent = dspy.ReAct("question -> answer", tools=[lookup], max_iters=3)
    compiled, _, task_engine, _ = run(["<INS>Use the tools, better.</INS>"], program=agent, task=agent_reply,
                                      num_steps=1, num_candidates=1, predictors=["react"])
    run_record = compiled.opro_run
    assert run_record.candidates[0].score == 0.0
    assert run_record.candidates[1].score == 1.0
    # Only the task part of ReAct's instructions is searched; its agent protocol and tool list are kept verbatim.
    instructions = compiled.react.signature.instructions
    original = agent.react.signature.instructions
    assert instructions == "Use the tools, better." + original[original.index("\n\nYou are an Agent."):]
    assert "lookup" in instructions
    start = run_record.candidates[0].instructions
    assert start == {"react": "Given the fields `question`, produce the fields `answer`."}
    assert run_record.predictors == ["react"]


def test_exemplar_answers_without_labels_use_program_output_or_feedback():
    train = [dspy.Example(question=f"item {i}", gold=f"a{i}").with_inputs("question") for i in range(4)]

    def metric(example, prediction, trace=None):
        if prediction.answer == example.gold:
            return 1.0
        return dspy.Prediction(score=0.0, feedback=f"expected something else for {example.question}")

    compiled, _, _, opt_engine = run(["<INS>Better better.</INS>"], trainset=train, metric=metric, num_steps=2,
                                     num_candidates=1, num_exemplars=4)
    step1 = optimizer_texts(opt_engine)[1]
    assert "item 0\n\nGround truth answer:\na0\n" in step1
    assert "item 1\n\nGround truth answer:\na1\n" in step1
    assert "item 2\n\nGround truth answer:\nexpected something else for item 2\n" in step1
    step0 = optimizer_texts(opt_engine)[0]
    assert "item 0\n\nGround truth answer:\nexpected something else for item 0\n" in step0


LOGGING_PROBE = """
import logging, sys
import dspy
from tests.test_teleprompter import run
run(["<INS>Better.</INS>"], num_steps=1, num_candidates=1)
logger = logging.getLogger("dspy_opro")
print("after:", logger.handlers, logger.level, logger.propagate, logging.getLogger().handlers, file=sys.stdout)
if sys.argv[1] == "silenced":
    dspy.disable_logging()
    run(["<INS>Better.</INS>"], num_steps=1, num_candidates=1)
"""


@pytest.mark.slow
def test_log_lines_go_through_dspys_stream_during_compile_only():
    """A fresh interpreter, as a user has it: nothing configured at import; during compile the lines go through
    DSPy's logging stream (so dspy.disable_logging() silences them); afterwards the logger is as it was."""
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", LOGGING_PROBE, "shown"], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "INFO dspy_opro.core.run: Step -1: scoring the program as given on 6 training examples" in ran.stderr
    assert ("Step 0: 1 replies, 1 new (0 without their closing tag), 0 duplicates, 0 skipped, 0 failed calls"
            in ran.stderr)
    assert "OPRO selected candidate 1" in ran.stderr
    assert "after: [] 0 True []" in ran.stdout
    silenced = subprocess.run([sys.executable, "-c", LOGGING_PROBE, "silenced"], capture_output=True, text=True,
                              cwd=Path(__file__).parent.parent, timeout=120)
    assert silenced.returncode == 0, silenced.stderr
    assert silenced.stderr.count("OPRO selected candidate 1") == 1  # the first compile's line; none from the second


def test_log_lines_reach_a_configured_root_logger(caplog):
    with caplog.at_level(logging.INFO):
        run(["<INS>Better.</INS>"], num_steps=1, num_candidates=1)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("dspy_opro")]
    assert "Step -1: scoring the program as given on 6 training examples" in messages
    assert logging.getLogger("dspy_opro").handlers == []


def test_threads_give_the_same_result():
    replies = ["<INS>Better.</INS>", "<INS>Better better.</INS>", "<INS>Better better better.</INS>"]
    one, *_ = run(replies, num_steps=1, num_candidates=3)
    many, _, task_engine, _ = run(replies, num_steps=1, num_candidates=3, num_threads=8)
    assert many.signature.instructions == one.signature.instructions == "Better better better."
    assert len(task_engine.requests) == 24


def test_opro_alias_and_teacher_refused():
    assert OPRO is OPROTeleprompter
    task_lm, engine = make_lm(toy_task_reply)
    optimizer = OPRO(toy_metric, prompt_model=task_lm, task_model=task_lm)
    with pytest.raises(ValueError, match="takes no teacher"):
        optimizer.compile(dspy.Predict("q -> a"), trainset=toy_dataset(3), teacher=dspy.Predict("q -> a"))
    assert engine.requests == []


@pytest.mark.slow  # starts a worker process
def test_a_process_pool_that_cannot_pickle_the_job_is_a_clear_error():
    import concurrent.futures as cf

    task_lm, _ = make_lm(toy_task_reply)
    with cf.ProcessPoolExecutor(max_workers=1) as pool:
        optimizer = OPROTeleprompter(toy_metric, prompt_model=task_lm, task_model=task_lm, num_steps=1,
                                     executor=pool)
        with pytest.raises(OPRORunError, match="use a Dask executor"):
            optimizer.compile(dspy.Predict("question -> answer"), trainset=toy_dataset(3))


def test_dspy_context_reaches_the_worker_threads():
    import json

    from tests.fakes import system_text

    def json_task(request):
        assert "JSON" in system_text(request)  # the JSON adapter set in the caller's context formatted it
        text = user_text(request)
        index = text.split("item ", 1)[1].split()[0].strip('"')
        return json.dumps({"answer": f"a{index}" if int(index) < skill(instruction_of(request)) else "wrong"})

    with dspy.context(adapter=dspy.JSONAdapter()):
        compiled, _, task_engine, _ = run(["<INS>Better better.</INS>"], task=json_task, num_steps=1,
                                          num_candidates=1, num_threads=4)
    assert len(task_engine.requests) == 12
    assert compiled.opro_run.candidates[1].score == 2 / 6
