"""The simulated OpenAI-compatible endpoint and simulated model, exercised through the real DSPy/LiteLLM stack.

The peer optimizers' proposals come from ``benchmarks/simulated_peers.py``, plugged in through the endpoint's one
hook (``responders``); the last tests check that ``dspy_opro`` has no import cycle.
"""

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import ast
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path

import dspy
import pytest
from dspy.utils.exceptions import (
    AdapterParseError,
    LMAuthError,
    LMProviderError,
    LMRateLimitError,
    LMServerError,
    LMTimeoutError,
    LMTransportError,
)

from benchmarks.simulated_peers import PEERS
from dspy_opro.testing import (
    TRAITS,
    FaultConfig,
    SimulatedEndpoint,
    SimulatedRequest,
    answers_correctly,
    arithmetic_tool,
    instruction_quality,
    simulated_dataset,
    simulated_metric,
    simulated_metric_with_feedback,
    simulated_reply,
    solve_question,
)
from dspy_opro.testing.adapter_prompts import parse_adapter_prompt
from dspy_opro.testing.hashing import stable_unit
from dspy_opro.testing.task_model import instruction_traits
from dspy_opro.testing.transport import RequestHandler

GOOD = "Let's think step by step, carefully, and verify the answer."
BAD = "Just guess quickly."
MODEL = "openai/sim-model"
GOLDEN = Path(__file__).parent / "golden" / "meta_prompts.jsonl"
META_PROMPT = (
    "Your task is to generate the instruction <INS>. Below are some previous instructions with their scores. "
    "The score ranges from 0 to 100.\n\ntext:\nSolve the problem.\nscore:\n31\n\ntext:\nLet's think step by step."
    "\nscore:\n52\n\ntext:\nLet's work step by step and verify the result.\nscore:\n61\n\n\nGenerate an instruction "
    "that is different from all the instructions <INS> above, and has a higher score than all the instructions <INS> "
    "above. The instruction should begin with <INS> and end with </INS>. The instruction should be concise, effective,"
    " and generally applicable to all problems above."
)


def make_lm(endpoint, engine="litellm", **kwargs):
    kwargs.setdefault("num_retries", 0)
    return dspy.LM(MODEL, api_base=endpoint.base_url, api_key="x", engine=engine, cache=False, **kwargs)


def first_int(text):
    match = re.search(r"-?\d+", str(text))
    return int(match.group(0)) if match else None


@pytest.fixture
def endpoint():
    with SimulatedEndpoint() as ep:
        yield ep


@pytest.fixture
def peer_endpoint():
    """The endpoint with the simulated COPRO, MIPROv2 and GEPA proposers plugged in."""
    with SimulatedEndpoint(responders=PEERS) as ep:
        yield ep


@pytest.fixture(scope="module")
def dataset():
    return simulated_dataset(40)


# ------------------------------------------------------------------------------------------------ simulated model


def test_dataset_is_deterministic_and_solvable(dataset):
    assert [ex.question for ex in dataset] == [ex.question for ex in simulated_dataset(40)]
    assert [ex.question for ex in simulated_dataset(40, seed=1)] != [ex.question for ex in dataset]
    assert len({ex.question for ex in dataset}) == 40
    for ex in dataset:
        assert set(ex.inputs().keys()) == {"question"}
        answer, expression = solve_question(ex.question)
        assert ex.answer == str(answer) and int(arithmetic_tool(expression)) == answer
    assert solve_question("What is the capital of France?") is None


def test_instruction_quality_landscape():
    assert instruction_quality("Solve the problem.") == pytest.approx(0.30)
    assert instruction_quality(GOOD) == pytest.approx(0.70)
    assert instruction_quality(BAD) == pytest.approx(0.05)  # 0.30 - 0.25 - 0.10, clipped
    assert instruction_quality("Work step-by-step, show your work, double-check, mind the units.") == pytest.approx(
        0.30 + 0.20 + 0.08 + 0.10 + 0.04
    )
    assert instruction_quality("Answer briefly, in one word.") == pytest.approx(0.22)
    assert instruction_quality("Let's think step by step. " + "x" * 400) < instruction_quality(
        "Let's think step by step."
    )
    assert {t.name for t in TRAITS if t.helpful} == {"step_by_step", "carefully", "verify", "show_work", "units"}


def test_arithmetic_tool_is_safe():
    assert arithmetic_tool("(3 + 4) * 2 - 10 / 5") == "12"
    assert arithmetic_tool("7 / 2") == "3.5"
    for bad in ("__import__('os')", "2 ** 10", "abs(-1)", "1 / 0", "x + 1"):
        with pytest.raises(ValueError):
            arithmetic_tool(bad)


def test_metric():
    ex = dspy.Example(question="q", answer="42").with_inputs("question")
    assert simulated_metric(ex, dspy.Prediction(answer="The answer is 42.")) == 1.0
    assert simulated_metric(ex, dspy.Prediction(answer="41")) == 0.0
    assert simulated_metric(ex, dspy.Prediction(answer="none")) == 0.0
    assert simulated_metric_with_feedback(ex, dspy.Prediction(answer="7")).score == 0.0


@pytest.mark.skipif(not GOLDEN.exists(), reason="golden meta-prompts not present")
def test_every_upstream_meta_prompt_wording_gets_a_tagged_reply():
    patterns = {
        "<INS>": r"<INS>(.*?)</INS>",
        "<Start>": r"<Start>(.*?)</Start>",
        "square brackets": r"\[(.*?)\]",
        "<TEXT>": r"<TEXT>(.*?)</TEXT>",
    }
    for line in GOLDEN.read_text().splitlines():
        case = json.loads(line)
        prompt = case["output"]
        if "Write the text in square brackets" in prompt:
            tag = "square brackets"
        elif "<Start>" in prompt:
            tag = "<Start>"
        elif "<INS>" in prompt:
            tag = "<INS>"
        else:
            tag = "<TEXT>"
        replies = [simulated_reply([{"role": "user", "content": prompt}], sample=s, seed=0) for s in range(6)]
        assert {kind for kind, _ in replies} == {"opro"}, case["case"]
        instructions = [re.search(patterns[tag], reply, re.DOTALL).group(1) for _, reply in replies]
        assert len(set(instructions)) >= 4, case["case"]
        for instruction in instructions:
            assert instruction_traits(instruction) and not re.search(r"\d", instruction) and "INS" not in instruction
    # chatter around the tags, as real models do, about one reply in eight
    replies = [simulated_reply([{"role": "user", "content": META_PROMPT}], sample=s)[1] for s in range(64)]
    chatty = sum(not reply.startswith("<INS>") or not reply.endswith("</INS>") for reply in replies)
    assert 2 <= chatty <= 20


def test_opro_reply_recombines_the_best_traits():
    replies = [simulated_reply([{"role": "user", "content": META_PROMPT}], sample=s)[1] for s in range(40)]
    instructions = [re.search(r"<INS>(.*?)</INS>", reply).group(1) for reply in replies]
    with_best = sum({"step_by_step", "verify"} <= {t.name for t in instruction_traits(i)} for i in instructions)
    assert with_best >= 20  # the best instruction's traits are usually kept
    assert sum(instruction_quality(i) > instruction_quality("Let's think step by step.") for i in instructions) >= 25


def proposal_kind_and_fields(signature, **inputs):
    adapter = dspy.ChatAdapter()
    kind, reply = simulated_reply(adapter.format(signature, [], inputs), sample=0, responders=PEERS)
    return kind, adapter.parse(signature, reply)


def test_proposal_prompts_are_classified_and_answered():
    from dspy.propose.dataset_summary_generator import DatasetDescriptor
    from dspy.propose.grounded_proposer import DescribeProgram, generate_instruction_class
    from dspy.teleprompt.copro_optimizer import BasicGenerateInstruction, GenerateInstructionGivenAttempts
    from dspy.teleprompt.gepa.instruction_proposal import ProposeInstruction

    basic = "Given the fields `question`, produce the fields `answer`."
    kind, out = proposal_kind_and_fields(BasicGenerateInstruction, basic_instruction=basic)
    assert kind == "copro" and instruction_quality(out["proposed_instruction"]) > instruction_quality(basic)
    assert out["proposed_prefix_for_output_field"]
    attempts = ["Instruction #1: Guess.", "Prefix #1: Answer:", "Resulting Score #1: 0.1"]
    attempts += ["Instruction #2: Think step by step.", "Prefix #2: Answer:", "Resulting Score #2: 0.5"]
    kind, out = proposal_kind_and_fields(GenerateInstructionGivenAttempts, attempted_instructions=attempts)
    assert kind == "copro" and "step_by_step" in {t.name for t in instruction_traits(out["proposed_instruction"])}

    mipro = generate_instruction_class().signature
    fields = {name: "Not provided" for name in mipro.input_fields}
    kind, out = proposal_kind_and_fields(mipro, **{**fields, "basic_instruction": basic, "tip": "Be creative."})
    assert kind == "mipro" and instruction_quality(out["proposed_instruction"]) > instruction_quality(basic)
    assert proposal_kind_and_fields(DatasetDescriptor, examples="...")[0] == "mipro"
    assert proposal_kind_and_fields(DescribeProgram, program_code="...", program_example="...")[0] == "mipro"

    kind, out = proposal_kind_and_fields(ProposeInstruction, current_instruction=basic, examples_with_feedback=[])
    assert kind == "gepa" and instruction_quality(out["new_instruction"]) > instruction_quality(basic)
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    raw = InstructionProposalSignature.prompt_renderer({"current_instruction_doc": basic, "dataset_with_feedback": []})
    kind, reply = simulated_reply([{"role": "user", "content": raw}], sample=0, responders=PEERS)
    new = InstructionProposalSignature.output_extractor(reply)["new_instruction"]
    assert kind == "gepa" and instruction_quality(new) > instruction_quality(basic)
    # Without the peers the endpoint does not know these prompts: the simulated model answers defaults.
    assert simulated_reply([{"role": "user", "content": raw}], sample=0) == ("unknown", "OK")
    copro = dspy.ChatAdapter().format(BasicGenerateInstruction, [], {"basic_instruction": basic})
    assert simulated_reply(copro, sample=0)[0] == "unknown"
    # OPRO's meta-prompt stays the endpoint's, with or without the peers.
    opro = [{"role": "user", "content": META_PROMPT}]
    assert simulated_reply(opro, sample=3, responders=PEERS) == simulated_reply(opro, sample=3)


# ------------------------------------------------------------------------------------------ through the client stack


def test_accuracy_follows_instruction_quality(endpoint, dataset):
    lm = make_lm(endpoint)
    accuracy = {}
    for module in (dspy.Predict, dspy.ChainOfThought):
        for instruction in (GOOD, BAD):
            endpoint.reset_log()
            program = module(dspy.Signature("question -> answer", instruction))
            evaluate = dspy.Evaluate(devset=dataset, metric=simulated_metric, num_threads=8, display_progress=False)
            with dspy.context(lm=lm):
                result = evaluate(program)
            predictions = [pred for _, pred, _ in result.results]
            assert all(first_int(pred.answer) is not None for pred in predictions)
            if module is dspy.ChainOfThought:
                assert all(pred.reasoning for pred in predictions)
            assert endpoint.count(kind="task") == endpoint.count(status=None) == len(dataset)
            expected = sum(answers_correctly(instruction, ex.question) for ex in dataset)
            assert round(result.score * len(dataset) / 100) == expected
            accuracy[module, instruction] = expected
    for module in (dspy.Predict, dspy.ChainOfThought):
        assert accuracy[module, GOOD] > accuracy[module, BAD] + 15
    assert instruction_quality(GOOD) > instruction_quality(BAD)


@pytest.mark.parametrize("engine", ["litellm", "auto"])
@pytest.mark.parametrize("module", [dspy.Predict, dspy.ChainOfThought])
def test_usage_matches_server_token_counts(endpoint, dataset, engine, module):
    lm = make_lm(endpoint, engine=engine)
    with dspy.context(lm=lm, track_usage=True):
        pred = module("question -> answer")(question=dataset[0].question)
    (record,) = endpoint.requests
    usage = pred.get_lm_usage()[MODEL]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        record.prompt_tokens,
        record.completion_tokens,
        record.total_tokens,
    )
    assert record.kind == "task" and record.status == 200 and record.model == "sim-model"


def test_json_adapter(endpoint, dataset):
    with dspy.context(lm=make_lm(endpoint), adapter=dspy.JSONAdapter()):
        pred = dspy.ChainOfThought(dspy.Signature("question -> answer: int", GOOD))(question=dataset[1].question)
    assert isinstance(pred.answer, int) and pred.reasoning
    (record,) = endpoint.requests
    kind, reply = simulated_reply(record.messages, sample=0)
    assert kind == "task" and json.loads(reply) == {"reasoning": pred.reasoning, "answer": pred.answer}


@pytest.mark.parametrize("engine", ["litellm", "auto"])
def test_opro_meta_prompt_through_lm(endpoint, engine):
    outputs = make_lm(endpoint, engine=engine)(META_PROMPT, n=4, temperature=1.0)
    instructions = [re.search(r"<INS>(.*?)</INS>", out).group(1) for out in outputs]
    assert len(instructions) == 4 and len(set(instructions)) >= 3
    assert all(instruction_traits(instruction) for instruction in instructions)
    records = endpoint.requests
    assert {r.kind for r in records} == {"opro"}
    # LiteLLM sends n in one request; DSPy's native engine sends n requests of n=1.
    assert [r.n for r in records] == ([4] if engine == "litellm" else [1, 1, 1, 1])


@pytest.mark.parametrize("adapter", [dspy.ChatAdapter, dspy.JSONAdapter])
def test_react_calls_the_tool_then_finishes(endpoint, dataset, adapter):
    example = dataset[2]
    with dspy.context(lm=make_lm(endpoint), adapter=adapter()):
        pred = dspy.ReAct("question -> answer", tools=[arithmetic_tool], max_iters=4)(question=example.question)
    trajectory = pred.trajectory
    assert trajectory["tool_name_0"] == "arithmetic_tool"
    assert trajectory["observation_0"] == example.answer
    assert trajectory["tool_name_1"] == "finish"
    assert first_int(pred.answer) is not None
    assert endpoint.count(kind="task") == endpoint.count(status=None) == 3  # two steps and the extract


def test_judge_preference(endpoint):
    judge = dspy.Predict("task_input, trajectory_a, trajectory_b -> preference: int, rationale")
    with dspy.context(lm=make_lm(endpoint)):
        pred = judge(
            task_input="A question.",
            trajectory_a="Instructions: Solve the problem.\nAnswer: 4",
            trajectory_b="Instructions: Let's think step by step.\nAnswer: 5",
        )
        unknown = judge(task_input="q", trajectory_a="no instruction here", trajectory_b="none either")
        other = dspy.Predict("text -> summary")(text="Some text.")
    assert pred.preference == 4 and pred.rationale  # round((0.50 - 0.30) * 20)
    assert unknown.preference == 0
    assert other.summary
    assert [r.kind for r in endpoint.requests] == ["judge", "judge", "unknown"]
    assert make_lm(endpoint)("Hello there") == ["OK"]


def kinds(endpoint):
    """How many requests of each kind the endpoint answered, and with which status."""
    return Counter((record.kind, record.status) for record in endpoint.requests)


def scored_instructions(endpoint, examples):
    """Each instruction the task model answered all of ``examples`` under, with how many of them the answer key says
    it gets right (read from the endpoint's log, not from the optimizer)."""
    asked = defaultdict(set)
    for record in endpoint.requests:
        if record.kind == "task":
            prompt = parse_adapter_prompt(record.messages)
            asked[prompt.instruction].add(prompt.inputs["question"])
    questions = {example.question for example in examples}
    return {
        instruction: sum(answers_correctly(instruction, question) for question in questions)
        for instruction, seen in asked.items()
        if questions <= seen
    }


# The peer optimizers against the simulator: deterministic, so the returned instruction, the requests of each kind
# and the answer key's verdict on every instruction they tried are exact.


def test_copro_compiles(peer_endpoint, dataset):
    endpoint = peer_endpoint
    with dspy.context(lm=make_lm(endpoint)):
        copro = dspy.COPRO(metric=simulated_metric, breadth=2, depth=1)
        program = copro.compile(
            dspy.Predict("question -> answer"), trainset=dataset[:8], eval_kwargs={"num_threads": 4}
        )
    assert kinds(endpoint) == {("copro", 200): 1, ("task", 200): 16}  # one proposal request; 2 candidates x 8
    scores = scored_instructions(endpoint, dataset[:8])
    assert scores == {"Given the fields `question`, produce the fields `answer`.": 2, "Let's show all work.": 3}
    assert program.signature.instructions == "Let's show all work."  # the best on the training set


def test_mipro_compiles(peer_endpoint, dataset):
    pytest.importorskip("optuna", reason="MIPROv2 needs the optional optuna dependency")
    endpoint = peer_endpoint
    with dspy.context(lm=make_lm(endpoint)):
        mipro = dspy.MIPROv2(
            metric=simulated_metric,
            auto=None,
            num_candidates=2,
            max_bootstrapped_demos=0,
            max_labeled_demos=0,
            num_threads=4,
            verbose=False,
        )
        program = mipro.compile(
            dspy.Predict("question -> answer"),
            trainset=dataset[:8],
            valset=dataset[8:14],
            num_trials=2,
            minibatch=False,
        )
    assert kinds(endpoint) == {("mipro", 200): 8, ("task", 200): 23}
    scores = scored_instructions(endpoint, dataset[8:14])
    assert program.signature.instructions == "Let's verify the result."
    # Two trials on the full validation set; the one the answer key rates higher wins.
    assert scores == {"Given the fields `question`, produce the fields `answer`.": 1, "Let's verify the result.": 2}


def test_gepa_compiles(peer_endpoint, dataset):
    endpoint = peer_endpoint
    lm = make_lm(endpoint)
    with dspy.context(lm=lm):
        gepa = dspy.GEPA(metric=simulated_metric_with_feedback, max_metric_calls=24, reflection_lm=lm, num_threads=4)
        program = gepa.compile(dspy.Predict("question -> answer"), trainset=dataset[:6], valset=dataset[6:10])
    assert kinds(endpoint) == {("gepa", 200): 4, ("task", 200): 28}
    scores = scored_instructions(endpoint, dataset[6:10])
    # Within 24 metric calls no reflected instruction was scored on the whole validation set, so GEPA keeps
    # the start.
    assert program.signature.instructions == "Given the fields `question`, produce the fields `answer`."
    assert scores == {"Given the fields `question`, produce the fields `answer`.": 1}


# ---------------------------------------------------------------------------------------------------------- faults

FAULTS = {
    "rate_limit": FaultConfig(rate_limit=1.0, retry_after=2),
    "server_error": FaultConfig(server_error=1.0),
    "malformed": FaultConfig(malformed=1.0),
    "empty_choices": FaultConfig(empty_choices=1.0),
    "hang": FaultConfig(hang=1.0, hang_seconds=30),
    "auth_error": FaultConfig(auth_error=True),
}
# What DSPy 3.4.1 raises to the caller of a Predict for each fault (num_retries=0, timeout=0.5).
# None: no exception (see the empty-choices test below).
RAISED = {
    "litellm": {
        "rate_limit": LMRateLimitError,
        "server_error": LMServerError,
        "malformed": LMServerError,
        "empty_choices": None,
        "hang": LMTimeoutError,
        "auth_error": LMAuthError,
    },
    "auto": {
        "rate_limit": LMRateLimitError,
        "server_error": LMServerError,
        "malformed": LMProviderError,
        "empty_choices": AdapterParseError,
        "hang": LMTransportError,
        "auth_error": LMAuthError,
    },
}


@pytest.mark.parametrize("engine", ["litellm", "auto"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_reaches_the_caller_as_dspy_error(endpoint, dataset, engine, fault):
    endpoint.faults = FAULTS[fault]
    lm = make_lm(endpoint, engine=engine, timeout=0.5)
    expected = RAISED[engine][fault]
    with dspy.context(lm=lm):
        if expected is None:
            pred = dspy.Predict("question -> answer")(question=dataset[0].question)
            assert not hasattr(pred, "answer")  # LiteLLM's empty choices give an empty Prediction, no error
        else:
            with pytest.raises(expected) as info:
                dspy.Predict("question -> answer")(question=dataset[0].question)
            assert type(info.value) is expected
    records = endpoint.requests
    assert records[0].fault == fault and records[0].kind == "task"
    if fault == "rate_limit":
        assert info.value.status == 429 and info.value.retry_after == 2.0
    if fault == "hang":
        assert records[0].status == 0  # still hanging; the fixture's stop() ends it
    if engine == "auto" and fault == "empty_choices":
        assert len(records) == 2  # ChatAdapter, then its JSONAdapter fallback


def test_fails_once_then_succeeds_with_dspy_retries(endpoint, dataset):
    endpoint.faults = FaultConfig(fail_requests={0}, fail_kind="rate_limit", retry_after=0)
    with dspy.context(lm=make_lm(endpoint, num_retries=1)):
        pred = dspy.Predict("question -> answer")(question=dataset[0].question)
    assert first_int(pred.answer) is not None
    assert [(r.status, r.fault) for r in endpoint.requests] == [(429, "rate_limit"), (200, None)]


def post(port, payload, path="/v1/chat/completions", conn=None):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response, response.read()


def test_raw_http_shapes(endpoint, dataset):
    messages = [{"role": "user", "content": "Hello there"}]
    response, body = post(endpoint.port, {"model": "m", "messages": messages, "n": 2})
    data = json.loads(body)
    assert response.status == 200 and data["object"] == "chat.completion" and data["model"] == "m"
    assert [c["index"] for c in data["choices"]] == [0, 1]
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "OK"}
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}

    endpoint.faults = FaultConfig(rate_limit=1.0, retry_after=1.5)
    response, body = post(endpoint.port, {"model": "m", "messages": messages})
    assert response.status == 429 and response.getheader("Retry-After") == "1.5"
    assert json.loads(body)["error"]["type"] == "rate_limit_error"
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
    endpoint.faults = FaultConfig(auth_error=True)
    response, body = post(endpoint.port, {"model": "m", "messages": messages})
    assert response.status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    endpoint.faults = FaultConfig()

    response, body = post(endpoint.port, {"model": "m", "messages": messages, "stream": True})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[0])["choices"][0]["delta"]["content"] == "OK"

    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    conn.request("GET", "/v1/models")
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["data"][0]["id"] == "sim-model"
    conn.request("GET", "/v1/nothing")
    response = conn.getresponse()
    assert response.status == 404 and "error" in json.loads(response.read())
    response, _ = post(endpoint.port, {"messages": "nope"}, conn=conn)
    assert response.status == 400
    assert [r.status for r in endpoint.requests] == [200, 429, 401, 200, 200, 404, 400]


def test_random_faults_are_deterministic_and_scoped():
    messages = [{"role": "user", "content": "Hello there"}]
    runs = []
    for _ in range(2):
        faults = FaultConfig(server_error=0.3, malformed=0.2, first_n=30)
        with SimulatedEndpoint(faults=faults, seed=3) as ep:
            conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
            for _ in range(40):
                post(ep.port, {"model": "m", "messages": messages}, conn=conn)
            runs.append([(r.status, r.fault) for r in ep.requests])
    assert runs[0] == runs[1]
    assert all(fault is None for _, fault in runs[0][30:])
    statuses = [status for status, _ in runs[0][:30]]
    assert 3 <= statuses.count(500) <= 16 and {s for s, f in runs[0] if f == "malformed"} <= {200}

    with SimulatedEndpoint(faults=FaultConfig(server_error=1.0, only_kinds={"opro"})) as ep:
        assert post(ep.port, {"model": "m", "messages": messages})[0].status == 200
        opro = [{"role": "user", "content": META_PROMPT}]
        assert post(ep.port, {"model": "m", "messages": opro})[0].status == 500
        ep.faults = FaultConfig(fail_requests={3}, fail_kind="empty_choices")
        response, body = post(ep.port, {"model": "m", "messages": messages})
        assert json.loads(body)["choices"] and ep.requests[-1].index == 2
        response, body = post(ep.port, {"model": "m", "messages": messages})
        assert json.loads(body)["choices"] == [] and ep.requests[-1].fault == "empty_choices"
        ep.reset_log()
        assert ep.count(status=None) == 0
        post(ep.port, {"model": "m", "messages": messages})
        assert ep.requests[0].index == 0


class _CountingSocket:
    """The server side of a connection, counting the writes of each answer (``sendall``/``send`` calls)."""

    def __init__(self, sock: socket.socket, writes: list[int]):
        self._sock, self._writes = sock, writes

    def sendall(self, data, *args):
        self._writes.append(len(data))
        return self._sock.sendall(data, *args)

    def send(self, data, *args):
        self._writes.append(len(data))
        return self._sock.send(data, *args)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _CountingWriter:
    """The handler's ``wfile``, counting writes too, so that an answer written through it would show up."""

    def __init__(self, wfile, writes: list[int]):
        self._wfile, self._writes = wfile, writes

    def write(self, data):
        self._writes.append(len(data))
        return self._wfile.write(data)

    def __getattr__(self, name):
        return getattr(self._wfile, name)


def test_keep_alive_answers_are_one_write_each_on_a_nodelay_socket(endpoint, monkeypatch):
    # An answer split over several writes stalls 40 ms on delayed ACKs unless TCP_NODELAY is set: assert both
    # causes are absent (one write per answer, TCP_NODELAY on the accepted socket), not a duration.
    writes: list[int] = []
    nodelay: list[int] = []
    original_setup = RequestHandler.setup

    def counting_setup(handler):
        original_setup(handler)
        nodelay.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        handler.connection = _CountingSocket(handler.connection, writes)
        handler.wfile = _CountingWriter(handler.wfile, writes)

    monkeypatch.setattr(RequestHandler, "setup", counting_setup)
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    payload = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}
    bodies = [post(endpoint.port, payload, conn=conn)[1] for _ in range(51)]
    assert len(writes) == 51 and all(size > len(body) for size, body in zip(writes, bodies, strict=True))
    assert len(nodelay) == 1 and nodelay[0] != 0  # one keep-alive connection, TCP_NODELAY set
    assert endpoint.count() == 51


def test_latency_is_drawn_per_request_and_waited(monkeypatch):
    waits: list[float] = []
    original_wait = SimulatedEndpoint._wait

    def recording_wait(self, seconds):
        waits.append(seconds)
        return original_wait(self, seconds)

    monkeypatch.setattr(SimulatedEndpoint, "_wait", recording_wait)
    with SimulatedEndpoint(latency=(0.01, 0.02), seed=5) as ep:
        for _ in range(3):
            post(ep.port, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert waits == [0.01 + 0.01 * stable_unit("latency", 5, index) for index in range(3)]
    assert all(0.01 <= wait <= 0.02 for wait in waits) and len(set(waits)) == 3
    with SimulatedEndpoint(latency=0.005) as ep:
        post(ep.port, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert waits[3:] == [0.005]


@pytest.mark.slow  # starts 21 endpoints
def test_start_stop_leaks_no_threads_and_frees_the_port():
    baseline = threading.active_count()
    connections, port = [], None
    for _ in range(20):
        ep = SimulatedEndpoint().start()
        port = ep.port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/models")
        conn.getresponse().read()
        connections.append(conn)  # left open: the server must close its side on stop()
        assert threading.active_count() > baseline
        ep.stop()
        assert not [t for t in threading.enumerate() if t.name.startswith("sim-endpoint")]
        assert threading.active_count() <= baseline
    with SimulatedEndpoint(port=port) as ep:
        assert ep.port == port and ep.base_url == f"http://127.0.0.1:{port}/v1"
        assert post(port, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})[0].status == 200
    assert threading.active_count() <= baseline
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", port))
    probe.close()
    for conn in connections:
        conn.close()


def test_stop_interrupts_a_hanging_request():
    ep = SimulatedEndpoint(faults=FaultConfig(hang=1.0, hang_seconds=600)).start()
    errors = []
    arrived = threading.Event()
    original_wait = ep._wait

    def signalling_wait(seconds):
        arrived.set()
        return original_wait(seconds)

    ep._wait = signalling_wait

    def client():
        try:
            post(ep.port, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        except Exception as exc:  # the server closes without answering
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    assert arrived.wait(60)  # the request is in its 600-second hang
    ep.stop()
    # stop() joins the connection threads, so the hang has ended before it returns; the client then sees the
    # connection closed, far sooner than the 600 seconds the hang would last.
    assert not [t for t in threading.enumerate() if t.name.startswith("sim-endpoint")]
    thread.join(60)
    assert not thread.is_alive() and len(errors) == 1
    (record,) = ep.requests
    assert record.status == 0 and record.fault == "hang"


@pytest.mark.slow  # a subprocess
def test_cli_serves_until_sigterm():
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dspy_opro.testing", "--port", "0", "--latency", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parent.parent,
    )
    try:
        line = proc.stdout.readline()
        match = re.fullmatch(r"listening on http://127\.0\.0\.1:(\d+)/v1\n", line)
        assert match, line
        response, body = post(int(match.group(1)), {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert response.status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "OK"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_lm_helper_reaches_the_endpoint_through_litellm():
    with SimulatedEndpoint() as endpoint:
        lm = endpoint.lm("openai/helper-model", num_retries=0)
        assert (lm.model, lm._engine_spec, lm.cache) == ("openai/helper-model", "litellm", False)
        assert lm.kwargs["api_base"] == endpoint.base_url
        reply = lm("Say hello.")
        assert len(reply) == 1 and endpoint.count() == 1
        assert endpoint.requests[0].model == "helper-model"


# ------------------------------------------------------------------------------------------------ the responder hook


def test_responders_claim_requests_before_the_simulated_model(dataset):
    asked: list[tuple[str, int]] = []
    seen: list[SimulatedRequest] = []

    def pong(request: SimulatedRequest) -> tuple[str, str] | None:
        asked.append(("pong", request.sample))
        seen.append(request)
        return ("custom", f"pong {request.sample}") if request.text == "ping" else None

    def second(request: SimulatedRequest) -> tuple[str, str] | None:
        asked.append(("second", request.sample))
        return None

    ping = {"model": "m", "messages": [{"role": "user", "content": "ping"}]}
    hello = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}
    with SimulatedEndpoint(responders=[pong, second], seed=7) as ep:
        _, body = post(ep.port, {**ping, "n": 3})
        assert [c["message"]["content"] for c in json.loads(body)["choices"]] == ["pong 0", "pong 1", "pong 2"]
        assert asked == [("pong", 0), ("pong", 1), ("pong", 2)]  # the first claim wins: second is not asked
        _, body = post(ep.port, hello)
        assert json.loads(body)["choices"][0]["message"]["content"] == "OK"  # passed on to the simulated model
        assert asked[3:] == [("pong", 0), ("second", 0)]
        with dspy.context(lm=make_lm(ep)):
            pred = dspy.Predict("question -> answer")(question=dataset[0].question)
        assert first_int(pred.answer) is not None
        task = seen[-1]
        assert task.prompt is not None and task.prompt.inputs["question"] == dataset[0].question
        assert (task.sample, task.seed, task.messages) == (0, 7, ep.requests[-1].messages)
        assert [(r.kind, r.status) for r in ep.requests] == [("custom", 200), ("unknown", 200), ("task", 200)]
        # The claimed kind is the request's kind everywhere, faults included.
        ep.faults = FaultConfig(server_error=1.0, only_kinds={"custom"})
        assert [post(ep.port, payload)[0].status for payload in (ping, hello)] == [500, 200]


# ------------------------------------------------------------------------------------------------ import cycles

PACKAGE = Path(__file__).resolve().parent.parent / "dspy_opro"


def imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``tree`` (the source of ``module``) imports anywhere: at the top, inside
    functions and under ``TYPE_CHECKING``. ``from P import name`` imports ``P.name`` when that is a module, else
    ``P``; relative imports are resolved against ``module``'s package."""
    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                targets.add(name)
    return targets


def package_imports() -> dict[str, set[str]]:
    """Every module of ``dspy_opro`` -> the ``dspy_opro`` modules it imports."""
    files = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    known = set(files)
    return {
        name: imported_modules(ast.parse(path.read_text(encoding="utf-8")), name, is_package, known)
        for name, (path, is_package) in files.items()
    }


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold a cycle (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_imports_are_found_in_functions_and_under_type_checking():
    source = (
        "from typing import TYPE_CHECKING\nimport dspy\nfrom . import faults\nfrom .hashing import stable_unit\n"
        "from dspy_opro.testing import FaultConfig\nif TYPE_CHECKING:\n    from dspy_opro.testing.server import X\n"
        "def main():\n    from dspy_opro.testing import cli\n    import dspy_opro.testing.transport as t\n"
    )
    known = {"dspy_opro", "dspy_opro.testing"} | {
        f"dspy_opro.testing.{name}" for name in ("faults", "hashing", "server", "cli", "transport", "x")
    }
    found = imported_modules(ast.parse(source), "dspy_opro.testing.x", False, known)
    assert found == {"dspy_opro.testing"} | {
        f"dspy_opro.testing.{name}" for name in ("faults", "hashing", "server", "cli", "transport")
    }
    # The shape the package had: server <-> cli (an import inside a function), server <-> transport (TYPE_CHECKING).
    graph = {"server": {"cli", "transport", "faults"}, "cli": {"server"}, "transport": {"server"}, "faults": set()}
    assert import_cycles(graph) == [["cli", "server", "transport"]]
    assert import_cycles({"a": {"a"}, "b": {"c"}, "c": set()}) == [["a"]]


def test_the_package_has_no_import_cycle():
    graph = package_imports()
    assert {"dspy_opro", "dspy_opro.testing", "dspy_opro.testing.server", "dspy_opro.testing.__main__"} <= set(graph)
    assert graph["dspy_opro.testing.__main__"] == {"dspy_opro.testing.faults", "dspy_opro.testing.server"}
    assert import_cycles(graph) == []


def test_testing_and_the_library_do_not_import_each_other():
    graph = package_imports()
    testing = {name for name in graph if name == "dspy_opro.testing" or name.startswith("dspy_opro.testing.")}
    assert sorted({target for name in testing for target in graph[name]} - testing) == []
    assert sorted(name for name in set(graph) - testing if graph[name] & testing) == []
