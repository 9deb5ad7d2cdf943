"""A local model server that dies is named as such: at start, through the counting proxy, in a run, and by ``serve``.

:class:`tests.crashing_server.CrashingServer` plays llama-cpp-python's server built for the wrong CPU features: it
loads, answers health checks, and dies with SIGSEGV on a chat completion. No real runtime is needed.
"""

from __future__ import annotations

import http.client
import io
import json
import signal
import threading
import urllib.request

import dspy
import pytest

from dspy_opro import OPRORunError, OPROTeleprompter
from dspy_opro.testing.local_model import (
    INSTALL_COMMAND,
    NATIVE_CMAKE_ARGS,
    PORTABLE_CMAKE_ARGS,
    CountingProxy,
    LocalServerExited,
    lm_settings,
    runtime_wheel_dir,
    serve,
)
from dspy_opro.testing.plain_adapter import PlainAdapter
from tests.crashing_server import LOADING_LINES, CrashingServer

SEGV = f"exited with status -{int(signal.SIGSEGV)} (SIGSEGV)"


def complete(base_url: str) -> dict:
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Capital of France?"}]}
    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_server_that_dies_on_its_first_token_fails_its_start_with_its_status_and_last_lines():
    server = CrashingServer(crash_at=1)
    with pytest.raises(LocalServerExited) as raised:
        server.start()
    message = str(raised.value)
    assert raised.value.status == -signal.SIGSEGV
    assert f"(pid {server.process.pid}) {SEGV}; its last output:" in message
    assert raised.value.output.splitlines() == [*LOADING_LINES, "llama_decode: generating the first token"]
    assert message.endswith(f"dies this way on CPUs with AVX-512 or AMX; install the portable build: {INSTALL_COMMAND}")


def test_a_live_server_is_not_reported_and_a_stopped_one_is_not_a_crash():
    with CrashingServer(crash_at=3) as server:
        assert complete(server.base_url)["choices"][0]["message"]["content"] == "Paris"  # the second completion
        assert server.exited() is None
        server.check()
    assert server.process.returncode is not None
    assert server.exited() is None  # stopped by stop(), not of itself
    server.check()


def test_the_proxy_answers_for_a_dead_server_with_its_exit_and_a_run_fails_with_that_cause_named():
    with CrashingServer(crash_at=2) as server, CountingProxy(upstream=server) as proxy:
        trainset = [dspy.Example(country=c, capital=k).with_inputs("country")
                    for c, k in [("France", "Paris"), ("Peru", "Lima")]]
        lm = dspy.LM("openai/smollm2-135m", cache=False, num_retries=0, **lm_settings(proxy.base_url, max_tokens=8))
        optimizer = OPROTeleprompter(lambda e, p, trace=None: e.capital == p.capital, prompt_model=lm,
                                     task_model=lm, num_steps=1, num_candidates=1, num_exemplars=1, num_threads=1,
                                     display_progress=False)
        with dspy.context(adapter=PlainAdapter()), pytest.raises(OPRORunError) as raised:
            optimizer.compile(dspy.Predict("country -> capital"), trainset=trainset)
        assert server.process.returncode == -signal.SIGSEGV
    statuses = [request.status for request in proxy.completions()]
    assert statuses[0] == 502 and set(statuses) == {502}
    # Two examples, each tried twice, then step -1 tries them once more: the server is gone for all of them.
    assert len(statuses) == 8
    assert f"the local model server llama_cpp.server (pid {server.process.pid}) {SEGV}" in str(raised.value)


def test_serve_says_when_its_server_exits_and_returns_1():
    with CrashingServer(crash_at=2) as server:
        out = io.StringIO()
        failures: list[BaseException] = []

        def crash() -> None:
            try:
                complete(server.base_url)
            except (OSError, http.client.HTTPException) as exc:
                failures.append(exc)

        crashing = threading.Timer(0.2, crash)
        crashing.start()
        assert serve(server, out=out) == 1
        crashing.join()
    assert len(failures) == 1  # the completion that crashed it got no answer
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"serving on {server.base_url} (started in ")
    assert lines[3] == f"error: the local model server llama_cpp.server (pid {server.process.pid}) {SEGV}; its " \
                       "last output:"
    assert lines[4:8] == [*LOADING_LINES, "llama_decode: generating the first token"]


def test_each_build_of_the_runtime_has_a_wheel_folder_named_by_version_and_flags(tmp_path):
    portable = runtime_wheel_dir(PORTABLE_CMAKE_ARGS, cache=tmp_path)
    native = runtime_wheel_dir(NATIVE_CMAKE_ARGS, cache=tmp_path)
    assert portable.parent == native.parent == tmp_path / "wheels"
    assert portable.name.startswith("llama-cpp-python-0.3.36-portable-")
    assert native.name.startswith("llama-cpp-python-0.3.36-native-")
    assert runtime_wheel_dir("-DGGML_NATIVE=OFF -DGGML_AVX2=OFF", cache=tmp_path).name.startswith(
        "llama-cpp-python-0.3.36-custom-")
    assert len({portable, native, runtime_wheel_dir(PORTABLE_CMAKE_ARGS, cache=tmp_path)}) == 2
    assert "-DGGML_NATIVE=OFF" in PORTABLE_CMAKE_ARGS
