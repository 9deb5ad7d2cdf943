"""A stand-in for llama-cpp-python's server that dies the way a llama.cpp built for the wrong CPU does.

``python -m tests.crashing_server PORT CRASH_AT`` answers ``/v1/models`` and chat completions like an
OpenAI-compatible server, prints a few lines as llama.cpp does while loading, and on its ``CRASH_AT``-th chat
completion (from 1) reads address 0 and dies with SIGSEGV before it answers: health checks pass, the first generated
token does not. :class:`CrashingServer` is a :class:`~dspy_opro.testing.local_model.LocalServer` that runs it.
"""

from __future__ import annotations

import ctypes
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dspy_opro.testing.local_model import LocalServer

LOADING_LINES = ["llama_model_loader: loaded meta data with 33 key-value pairs", "system_info: n_threads = 2",
                 "INFO:     Uvicorn running on http://127.0.0.1"]


class CrashingServer(LocalServer):
    """``LocalServer`` running :mod:`tests.crashing_server`, which crashes on its ``crash_at``-th completion."""

    def __init__(self, *, crash_at: int, **options):
        super().__init__(model=Path("unused.gguf"), startup_timeout=30.0, **options)
        self.crash_at = crash_at

    def command(self, model: Path) -> list[str]:
        return [sys.executable, "-m", "tests.crashing_server", str(self.port), str(self.crash_at)]


def main(port: int, crash_at: int) -> None:
    completions = 0

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002
            return

        def _answer(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._answer({"object": "list", "data": [{"id": "smollm2-135m", "object": "model"}]})

        def do_POST(self):  # noqa: N802
            nonlocal completions
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            completions += 1
            if completions >= crash_at:
                print("llama_decode: generating the first token", flush=True)
                ctypes.string_at(0)  # a read of address 0: SIGSEGV, as in native code
            self._answer({"id": "x", "object": "chat.completion", "created": 0, "model": request.get("model", ""),
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": "Paris"}}],
                          "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})

    for line in LOADING_LINES:
        print(line, flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
