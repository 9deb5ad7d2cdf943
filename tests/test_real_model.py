"""A real model in the loop: SmolLM2-135M-Instruct served by llama-cpp-python on 127.0.0.1, behind a counting proxy.

Small compiles (2 steps, 4 candidates, 6 examples of ``benchmarks/data/capitals.jsonl``) that assert plumbing, not
accuracy, against what the proxy saw on the wire: every step gets its ``num_candidates`` replies although the server
ignores ``n``; the requests the run records are the requests the server answered; a SIGKILL mid-run and a resume buy
again only the evaluation in flight; a ``timeout`` shorter than a generation ends that evaluation as an
infrastructure failure.

They skip, naming the command that installs what is missing, without ``llama-cpp-python[server]`` or without the
model in the cache; in CI (``CI=true`` or ``DSPY_OPRO_REQUIRE_REAL_MODEL=1``) a missing runtime or model is a
failure instead. ``python -m tests.test_real_model BASE_URL LOG_DIR KILL_AT`` is the child process the SIGKILL test
runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import pytest  # noqa: E402

from benchmarks.real_model import TASK_MODEL, load_task  # noqa: E402
from dspy_opro import OPRORunError, OPROTeleprompter  # noqa: E402
from dspy_opro.record.files import ProgressJournal, load_state  # noqa: E402
from dspy_opro.testing.local_model import (  # noqa: E402
    INSTALL_COMMAND,
    CountingProxy,
    LocalServer,
    lm_settings,
    missing_runtime,
    model_file,
)
from dspy_opro.testing.plain_adapter import PlainAdapter  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZER = "openai/smollm2-optimizer"
STEPS, CANDIDATES, EXAMPLES = 2, 4, 6
FETCH_COMMAND = "python -m dspy_opro.testing.local_model fetch"


def required() -> bool:
    """Whether a missing runtime or model fails the tests instead of skipping them (CI)."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("DSPY_OPRO_REQUIRE_REAL_MODEL") == "1"


def unavailable(reason: str) -> None:
    (pytest.fail if required() else pytest.skip)(reason)


@pytest.fixture(scope="module")
def local_server() -> Iterator[LocalServer]:
    """llama-cpp-python's server with SmolLM2-135M-Instruct on a free loopback port, for this module."""
    missing = missing_runtime()
    if missing:
        unavailable(f"llama-cpp-python's server is not installed (missing {missing}): {INSTALL_COMMAND}")
    if not model_file().is_file():
        unavailable(f"SmolLM2-135M-Instruct is not in the cache ({model_file()}): {FETCH_COMMAND}")
    with LocalServer(model=model_file(), n_threads=2) as server:  # start() has it generate a token
        yield server


@pytest.fixture
def proxy(local_server: LocalServer) -> Iterator[CountingProxy]:
    """A counting proxy in front of the server: its log is what this test sent and what the server answered.

    A server that died in an earlier test fails this one at once, naming its exit (``LocalServerExited``); one that
    dies during the test is named in the proxy's 502s, and fails the test at its end.
    """
    local_server.check()
    with CountingProxy(upstream=local_server) as counting:
        yield counting
    local_server.check()


def build(base_url: str, log_dir: str | None = None, **options: Any) -> tuple[OPROTeleprompter, dspy.Module,
                                                                               list[dspy.Example], dspy.LM]:
    trainset, _, metric, signature = load_task("capitals")
    task_tokens = options.pop("task_tokens", 8)
    task_lm = dspy.LM(TASK_MODEL, temperature=0.0, cache=False, num_retries=0,
                      **lm_settings(base_url, max_tokens=task_tokens))
    prompt_lm = dspy.LM(OPTIMIZER, temperature=1.0, cache=False, num_retries=0, **lm_settings(base_url, max_tokens=40))
    settings: dict[str, Any] = {"num_steps": STEPS, "num_candidates": CANDIDATES, "num_exemplars": 2,
                                "max_tokens": 40, "num_threads": 1, "display_progress": False, **options}
    teleprompter = OPROTeleprompter(metric, prompt_model=prompt_lm, task_model=task_lm, log_dir=log_dir, **settings)
    return teleprompter, dspy.Predict(signature), trainset[:EXAMPLES], task_lm


def served(proxy: CountingProxy, model: str | None = None) -> list[Any]:
    """The chat completions the server answered (HTTP 200), of one model name or all."""
    return [r for r in proxy.completions()
            if r.status == 200 and (model is None or (r.body or {}).get("model") == model.split("/", 1)[1])]


@pytest.fixture(scope="module")
def small_compile(local_server: LocalServer) -> Iterator[tuple[dspy.Module, CountingProxy]]:
    """One compile (2 steps x 4 candidates, 6 examples) and the proxy's log of it, shared by the plumbing tests."""
    local_server.check()
    with CountingProxy(upstream=local_server) as counting:
        teleprompter, program, trainset, _ = build(counting.base_url)
        with dspy.context(adapter=PlainAdapter()):
            compiled = teleprompter.compile(program, trainset=trainset)
        yield compiled, counting


def test_the_server_is_alive_after_its_first_completion(local_server):
    """A llama.cpp built for the wrong CPU features answers health checks and dies on its first token: the server
    must still run after completions (the fixture's start asked for one token; this asks for more)."""
    body = {"model": "smollm2-task", "messages": [{"role": "user", "content": "The capital of France is"}],
            "max_tokens": 4}
    request = urllib.request.Request(f"{local_server.base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] >= 1
    assert local_server.exited(wait=1.0) is None
    assert local_server.process is not None and local_server.process.poll() is None


def test_the_server_answers_a_request_for_n_choices_with_one(proxy):
    """The premise of the next test, checked on the wire: llama-cpp-python's server ignores ``n``."""
    body = {"model": "smollm2-optimizer", "messages": [{"role": "user", "content": "Say hello."}], "n": 3,
            "max_tokens": 8}
    request = urllib.request.Request(f"{proxy.base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert len(answer["choices"]) == 1
    assert [(r.status, r.choices, r.body["n"]) for r in proxy.completions()] == [(200, 1, 3)]


def test_every_step_gets_its_num_candidates_replies_although_the_server_ignores_n(small_compile):
    compiled, proxy = small_compile
    run = compiled.opro_run
    assert [len(step.replies) for step in run.steps] == [CANDIDATES] * STEPS
    assert [step.failed_calls for step in run.steps] == [0] * STEPS
    optimizer = served(proxy, OPTIMIZER)
    # Step 0 asks once for 4 choices, gets 1, then asks 3 times for one; step 1 asks 4 times for one.
    assert [(r.body or {}).get("n", 1) for r in optimizer] == [CANDIDATES] + [1] * (2 * CANDIDATES - 1)
    assert [r.choices for r in optimizer] == [1] * (2 * CANDIDATES)


def test_the_requests_the_run_records_are_the_requests_the_server_answered(small_compile):
    compiled, proxy = small_compile
    run = compiled.opro_run
    assert run.status == "finished"
    assert all(r.status == 200 for r in proxy.completions())
    assert run.usage.optimizer.calls == len(served(proxy, OPTIMIZER)) == 2 * CANDIDATES
    assert run.usage.task.calls == len(served(proxy, TASK_MODEL)) == run.metric_calls
    assert run.usage.optimizer.calls + run.usage.task.calls == len(served(proxy))
    ran = [c for c in run.candidates if c.status != "skipped"]
    assert run.metric_calls == EXAMPLES * len(ran)


def test_sigkill_and_resume_buy_again_only_the_evaluation_in_flight(proxy, tmp_path):
    log_dir = tmp_path / "run"
    kill_at = EXAMPLES + 3  # the third evaluation of step 0's first candidate
    child = subprocess.run([sys.executable, "-m", "tests.test_real_model", proxy.base_url, str(log_dir),
                            str(kill_at)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert child.returncode == -9, child.stderr[-3000:]
    before = len(served(proxy))
    killed = load_state(log_dir)
    assert killed is not None and killed.status == "running"
    # Snapshot and journal hold every evaluation but the one in flight, answered and never recorded.
    assert killed.metric_calls + len(ProgressJournal.read(log_dir)) == kill_at - 1
    teleprompter, program, trainset, _ = build(proxy.base_url, str(log_dir))
    with dspy.context(adapter=PlainAdapter()):
        resumed = teleprompter.compile(program, trainset=trainset).opro_run
    after = served(proxy)
    assert resumed.status == "finished"
    # Everything the server answered is in the record, but the one evaluation the kill cut off, bought twice.
    assert resumed.usage.optimizer.calls + resumed.usage.task.calls == len(after) - 1
    task_prompts = Counter(json.dumps(r.body["messages"]) for r in after if r.body["model"] == "smollm2-task")
    assert sorted(task_prompts.values(), reverse=True)[:2] == [2, 1]
    assert len(after) > before


def test_a_timeout_shorter_than_a_long_generation_is_an_infrastructure_failure(proxy, tmp_path):
    """An evaluation that outlives ``timeout`` is abandoned, tried once more, then left unscored as an infrastructure
    failure (never a program error); a start that cannot be scored stops the run before any optimizer call, with the
    record saved."""
    log_dir = tmp_path / "run"
    teleprompter, program, trainset, task_lm = build(proxy.base_url, str(log_dir), num_steps=1, timeout=1.0,
                                                     task_tokens=300)
    # No end-of-sequence token: every answer runs to 300 tokens, many seconds on this machine.
    task_lm.kwargs["logit_bias"] = {"0": -100, "2": -100}
    with dspy.context(adapter=PlainAdapter()), pytest.raises(OPRORunError) as raised:
        teleprompter.compile(program, trainset=trainset[:2])
    assert "TimeoutError: the evaluation did not finish within timeout=1 s and was abandoned" in str(raised.value)
    start = load_state(log_dir).candidates[0]
    assert start.status == "unscored" and start.scores == [None, None]
    assert "timeout=1 s" in (start.reason or "")
    assert start.error_count == 0  # an infrastructure failure, not a failure of the program
    assert not [r for r in proxy.completions() if (r.body or {}).get("model") == OPTIMIZER.split("/", 1)[1]]
    # The abandoned generations go on at the server; the proxy logs each when it ends, over a second after it began.
    deadline = time.monotonic() + 300
    while not any(r.seconds > 1.0 for r in proxy.completions()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(r.seconds > 1.0 for r in proxy.completions())

if __name__ == "__main__":
    from tests.kill_job import KillAt

    base_url, log_dir, kill_at = sys.argv[1:4]
    teleprompter, program, trainset, _ = build(base_url, log_dir)
    killer = KillAt(TASK_MODEL, [e.country for e in trainset], int(kill_at))
    with dspy.context(adapter=PlainAdapter(), callbacks=[killer]):
        teleprompter.compile(program, trainset=trainset)
    sys.exit(3)  # the kill point was never reached
