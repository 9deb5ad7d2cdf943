"""A simulated OpenAI-compatible chat-completions endpoint on 127.0.0.1, for tests, benchmarks and offline demos.

The real DSPy/LiteLLM client stack talks to it over HTTP; the replies come from
:func:`dspy_opro.testing.simulated.simulated_reply`. Faults (429 with Retry-After, 500, hangs, malformed JSON,
empty choices, 401) can be injected deterministically.

Example::

    with SimulatedEndpoint() as endpoint:
        lm = dspy.LM("openai/sim-model", api_base=endpoint.base_url, api_key="x", cache=False)
        ...
        endpoint.count(kind="task")

Command line: ``python -m dspy_opro.testing.server --port 8765 --latency 0.05`` prints
``listening on http://127.0.0.1:8765/v1`` and serves until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dspy_opro.testing.simulated import _unit, simulated_reply

__all__ = ["FAULT_KINDS", "FaultConfig", "RequestRecord", "SimulatedEndpoint", "main"]

FAULT_KINDS = ("rate_limit", "server_error", "malformed", "empty_choices", "hang", "auth_error", "permission_denied",
               "model_not_found", "one_choice", "odd_text", "invalid_utf8")
# Refusals no retry can fix, with OpenAI's status and error body: (status, message, type, code).
_REFUSALS = {
    "auth_error": (401, "Incorrect API key provided. You can find your API key at "
                   "https://platform.openai.com/account/api-keys.", "invalid_request_error", "invalid_api_key"),
    "permission_denied": (403, "You are not allowed to use this model (simulated).", "invalid_request_error",
                          "model_not_allowed"),
    "model_not_found": (404, "The model does not exist or you do not have access to it (simulated).",
                        "invalid_request_error", "model_not_found"),
}
_MODEL_ID = "sim-model"
_ODD_BYTES_MARK = "@@not-utf8@@"


@dataclass
class FaultConfig:
    """Which requests fail, and how.

    The shares ``rate_limit``, ``server_error``, ``hang``, ``malformed`` and ``empty_choices`` are drawn with one
    deterministic uniform number per request (from the endpoint's seed and the request index), so they are
    exclusive and their sum must not exceed 1.

    Attributes:
        rate_limit: Share of requests answered 429 with ``Retry-After: <retry_after>`` and OpenAI's
            ``rate_limit_exceeded`` error body.
        retry_after: Seconds sent in the Retry-After header.
        server_error: Share of requests answered 500.
        hang: Share of requests that wait ``hang_seconds`` before answering normally. The wait ends at once when
            the endpoint stops; the connection is then closed without an answer.
        hang_seconds: How long a hanging request waits.
        malformed: Share of 200 answers whose body is not valid JSON.
        empty_choices: Share of 200 answers with ``"choices": []``.
        auth_error: Answer every request 401 with OpenAI's ``invalid_api_key`` error body.
        only_kinds: Apply faults (random and ``fail_requests``) only to requests of these kinds
            (``task``, ``opro``, ``copro``, ``mipro``, ``gepa``, ``judge``, ``unknown``).
        first_n: Apply the random faults only to requests with index < first_n.
        fail_requests: Request indices (0-based, counted since the start or the last ``reset_log()``) that get
            ``fail_kind``.
        fail_kind: One of ``rate_limit``, ``server_error``, ``malformed``, ``empty_choices``, ``hang``, or (only
            through ``fail_requests``) ``auth_error`` (401), ``permission_denied`` (403), ``model_not_found`` (404)
            and ``one_choice`` (a 200 answer with a single choice whatever ``n`` asked for, as providers that
            ignore ``n`` do), ``odd_text`` (each choice ends in an escaped lone surrogate and a NUL) and
            ``invalid_utf8`` (each choice ends in two raw bytes that are not UTF-8).
    """

    rate_limit: float = 0.0
    retry_after: float = 0.0
    server_error: float = 0.0
    hang: float = 0.0
    hang_seconds: float = 30.0
    malformed: float = 0.0
    empty_choices: float = 0.0
    auth_error: bool = False
    only_kinds: set[str] | None = None
    first_n: int | None = None
    fail_requests: set[int] | None = None
    fail_kind: str = "server_error"

    def __post_init__(self):
        shares = (self.rate_limit, self.server_error, self.hang, self.malformed, self.empty_choices)
        if any(share < 0 or share > 1 for share in shares) or sum(shares) > 1 + 1e-9:
            raise ValueError("fault shares must lie in [0, 1] and sum to at most 1")
        if self.fail_kind not in FAULT_KINDS:
            raise ValueError(f"fail_kind must be one of {FAULT_KINDS}, got {self.fail_kind!r}")
        if self.retry_after < 0 or self.hang_seconds < 0:
            raise ValueError("retry_after and hang_seconds must be non-negative")
        if self.only_kinds is not None:
            self.only_kinds = set(self.only_kinds)
        if self.fail_requests is not None:
            self.fail_requests = set(self.fail_requests)

    def choose(self, index: int, kind: str, seed: int) -> str | None:
        """The fault for request ``index`` of ``kind`` (None for a normal answer); ``auth_error`` not included."""
        if self.only_kinds is not None and kind not in self.only_kinds:
            return None
        if self.fail_requests is not None and index in self.fail_requests:
            return self.fail_kind
        if self.first_n is not None and index >= self.first_n:
            return None
        u = _unit("fault", seed, index)
        for name, share in (
            ("rate_limit", self.rate_limit),
            ("server_error", self.server_error),
            ("hang", self.hang),
            ("malformed", self.malformed),
            ("empty_choices", self.empty_choices),
        ):
            if u < share:
                return name
            u -= share
        return None


@dataclass
class RequestRecord:
    """One request the endpoint received.

    ``status`` is the HTTP status sent (0 when the connection was closed without an answer, e.g. a hang cut short
    by ``stop()``); ``fault`` the injected fault's name or None. Token counts are whitespace-split words: the
    prompt's over all messages, the completion's summed over the choices actually sent.
    """

    index: int
    kind: str
    model: str | None
    n: int
    status: int
    fault: str | None
    prompt_tokens: int
    completion_tokens: int
    started: float
    finished: float
    messages: list[dict] = field(default_factory=list)
    path: str = "/v1/chat/completions"
    cached_tokens: int = 0  # prompt tokens reported as served from the provider's prompt cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def count_tokens(text: str) -> int:
    """The endpoint's deterministic token count: whitespace-separated words."""
    return len(text.split())


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class _Stopped(Exception):
    """The endpoint stopped while a request was waiting; close without answering."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "SimulatedOpenAI/1.0"
    sys_version = ""

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

    def do_POST(self):
        self.server.endpoint._handle(self, "POST")

    def do_GET(self):
        self.server.endpoint._handle(self, "GET")

    def do_PUT(self):
        self.server.endpoint._handle(self, "PUT")

    def do_DELETE(self):
        self.server.endpoint._handle(self, "DELETE")

    def read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_all(self, status: int, body: bytes, content_type: str = "application/json", headers=()) -> None:
        """Status line, headers and body in one ``sendall`` (no delayed-ACK stall between packets)."""
        lines = [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Server: {self.server_version}",
            f"Date: {self.date_time_string()}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if self.close_connection:
            lines.append("Connection: close")
        else:
            lines.append("Connection: keep-alive")
        self.connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address, endpoint: SimulatedEndpoint):
        self.endpoint = endpoint
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="sim-endpoint-conn", daemon=True
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def _serve_connection(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:  # a client that went away mid-request
            pass
        finally:
            self.shutdown_request(request)
            with self._connections_lock:
                self._connections.pop(request, None)

    def close_connections(self, timeout: float = 5.0) -> None:
        with self._connections_lock:
            items = list(self._connections.items())
        for sock, _ in items:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for _, thread in items:
            thread.join(max(0.0, deadline - time.monotonic()))


class SimulatedEndpoint:
    """A threaded OpenAI-compatible HTTP server answering with the simulated model.

    Args:
        latency: Seconds to wait before each answer, or a ``(low, high)`` range drawn per request (deterministic).
        faults: Fault injection; can be replaced at runtime through the ``faults`` attribute.
        seed: Seed of the simulated model and of the fault draws.
        host: Interface to bind (keep 127.0.0.1).
        port: Port to bind; 0 picks a free one.
        cached_tokens: Prompt tokens each answer reports as read from a prompt cache
            (``usage.prompt_tokens_details.cached_tokens``, at most the prompt's tokens), as OpenAI does, so that
            cached-token discounts can be tested.

    Use as a context manager or call ``start()``/``stop()``. Routes: ``POST /v1/chat/completions``,
    ``GET /v1/models``; anything else gets a 404 JSON error.

    When a request's ``temperature`` is absent or positive, repeating an identical request draws new samples (as
    a sampling model would), so n separate ``n=1`` requests give n different proposals; ``reset_log()`` resets
    that memory along with the log and the request index.
    """

    def __init__(
        self,
        *,
        latency: float | tuple[float, float] = 0.0,
        faults: FaultConfig | None = None,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        cached_tokens: int = 0,
    ):
        if isinstance(latency, (tuple, list)):
            low, high = (float(x) for x in latency)
            if low < 0 or high < low:
                raise ValueError("latency range must satisfy 0 <= low <= high")
            self.latency: float | tuple[float, float] = (low, high)
        else:
            if latency < 0:
                raise ValueError("latency must be non-negative")
            self.latency = float(latency)
        self.faults = faults if faults is not None else FaultConfig()
        if cached_tokens < 0:
            raise ValueError("cached_tokens must be non-negative")
        self.cached_tokens = cached_tokens
        self.seed = seed
        self.host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._next_index = 0
        self._repeats: dict[str, int] = {}
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> SimulatedEndpoint:
        if self._server is not None:
            raise RuntimeError("endpoint already started")
        self._stopping.clear()
        self._server = _Server((self.host, self._requested_port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="sim-endpoint", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end waiting requests, close every connection and the socket, and join all threads."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        if thread is not None:
            thread.join()
        server.close_connections()
        server.server_close()
        self._server = self._thread = None

    def __enter__(self) -> SimulatedEndpoint:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("endpoint is not running")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def lm(self, model: str = "openai/simulated-task", **kwargs: Any) -> Any:
        """A ``dspy.LM`` that reaches this endpoint through LiteLLM (no cache; ``kwargs`` override the defaults).

        The model name is free: it only tells the requests of different models apart in the log.
        """
        import dspy

        options = {"api_base": self.base_url, "api_key": "offline", "engine": "litellm", "cache": False, **kwargs}
        return dspy.LM(model, **options)

    # ---------------------------------------------------------------------------------------------------------- log

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log, in arrival order (a request still being answered has status 0)."""
        with self._lock:
            return [dataclasses.replace(record) for record in sorted(self._records, key=lambda r: r.index)]

    def count(self, kind: str | None = None, status: int | None = 200) -> int:
        """How many logged requests have this kind (None: any) and HTTP status (None: any)."""
        with self._lock:
            return sum(
                1
                for record in self._records
                if (kind is None or record.kind == kind) and (status is None or record.status == status)
            )

    def reset_log(self) -> None:
        """Forget the log, restart request indices at 0 and forget repeated prompts."""
        with self._lock:
            self._records.clear()
            self._next_index = 0
            self._repeats.clear()

    # ------------------------------------------------------------------------------------------------------ serving

    def _wait(self, seconds: float) -> None:
        if seconds > 0 and self._stopping.wait(seconds):
            raise _Stopped

    def _latency_for(self, index: int) -> float:
        if isinstance(self.latency, tuple):
            low, high = self.latency
            return low + (high - low) * _unit("latency", self.seed, index)
        return self.latency

    def _handle(self, handler: _Handler, method: str) -> None:
        started = time.monotonic()
        try:
            body = handler.read_body()
        except (OSError, ValueError):
            handler.close_connection = True
            return
        path = handler.path.split("?", 1)[0].rstrip("/")
        with self._lock:
            index = self._next_index
            self._next_index += 1
            # Logged on arrival (status 0 until answered) so in-flight requests show up; reset_log() drops it.
            record = RequestRecord(index, "unknown", None, 0, 0, None, 0, 0, started, started, [], path)
            self._records.append(record)
        try:
            self._respond(handler, method, path, body, record)
        except _Stopped:
            handler.close_connection = True
        except OSError:  # the client went away
            handler.close_connection = True
        except Exception as exc:  # a bug in the simulated model: answer 500 rather than drop the connection
            if record.status == 0:
                record.fault = "internal_error"
                record.status, record.finished = 500, time.monotonic()
                message = f"simulated model failed: {type(exc).__name__}: {exc}"
                handler.close_connection = True
                handler.send_all(500, _error_body(message, "server_error", "internal_error"))
        finally:
            if record.status == 0:
                record.finished = time.monotonic()

    def _respond(self, handler: _Handler, method: str, path: str, body: bytes, record: RequestRecord) -> None:
        def send(status: int, payload: bytes, content_type: str = "application/json", headers=()) -> None:
            record.status, record.finished = status, time.monotonic()
            handler.send_all(status, payload, content_type, headers)

        if path in ("/v1/models", "/models") and method == "GET":
            models = {"object": "list", "data": [{"id": _MODEL_ID, "object": "model", "created": 0, "owned_by": "sim"}]}
            send(200, json.dumps(models).encode())
            return
        if path not in ("/v1/chat/completions", "/chat/completions") or method != "POST":
            message = f"Unknown request URL: {method} {handler.path}."
            send(404, _error_body(message, "invalid_request_error", "unknown_url"))
            return
        try:
            request = json.loads(body or b"null")
            if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
                raise ValueError("'messages' must be a list")
            n = request.get("n") or 1
            if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > 128:
                raise ValueError("'n' must be an integer between 1 and 128")
        except ValueError as exc:
            send(400, _error_body(f"Invalid request: {exc}", "invalid_request_error", None))
            return

        messages = request["messages"]
        record.messages, record.model, record.n = messages, request.get("model"), n
        texts = [_message_text(m.get("content")) for m in messages if isinstance(m, dict)]
        record.prompt_tokens = sum(count_tokens(text) for text in texts)
        kind, first = simulated_reply(messages, sample=0, seed=self.seed)
        record.kind = kind

        faults = self.faults
        if faults.auth_error:
            record.fault = "auth_error"
            message = (
                "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
            )
            send(401, _error_body(message, "invalid_request_error", "invalid_api_key"))
            return
        fault = record.fault = faults.choose(record.index, kind, self.seed)
        if fault in _REFUSALS:
            status, message, type_, code = _REFUSALS[fault]
            send(status, _error_body(message, type_, code))
            return
        self._wait(self._latency_for(record.index))
        if fault == "rate_limit":
            retry_after = float(faults.retry_after)
            header = str(int(retry_after)) if retry_after.is_integer() else repr(retry_after)
            message = "Rate limit reached for requests (simulated). Please try again later."
            error = _error_body(message, "rate_limit_error", "rate_limit_exceeded")
            send(429, error, headers=[("Retry-After", header)])
            return
        if fault == "server_error":
            message = "The server had an error while processing your request (simulated)."
            send(500, _error_body(message, "server_error", None))
            return
        if fault == "hang":
            self._wait(faults.hang_seconds)

        response_id = f"chatcmpl-sim-{record.index}"
        if fault == "malformed":
            send(200, f'{{"id": "{response_id}", "object": "chat.completion", "choices": [{{"index": 0, "mess'.encode())
            return
        contents = [] if fault == "empty_choices" else self._contents(request, messages, n, first)
        if fault == "one_choice":
            contents = contents[:1]
        record.completion_tokens = sum(count_tokens(content) for content in contents)
        usage = {
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "total_tokens": record.prompt_tokens + record.completion_tokens,
        }
        if self.cached_tokens:
            record.cached_tokens = min(self.cached_tokens, record.prompt_tokens)
            usage["prompt_tokens_details"] = {"cached_tokens": record.cached_tokens}
        created, model = int(time.time()), record.model or _MODEL_ID
        if request.get("stream"):
            stream = self._stream_body(response_id, created, model, contents, usage, request)
            send(200, stream, content_type="text/event-stream", headers=[("Cache-Control", "no-cache")])
            return
        if fault == "odd_text":
            contents = [f"{content} \ud800 \x00" for content in contents]
        if fault == "invalid_utf8":
            contents = [f"{content} {_ODD_BYTES_MARK}" for content in contents]
        payload = {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
                for i, content in enumerate(contents)
            ],
            "usage": usage,
        }
        if fault in ("odd_text", "invalid_utf8"):  # ASCII JSON escapes the surrogate and the NUL
            raw = json.dumps(payload).encode("ascii").replace(_ODD_BYTES_MARK.encode(), b"\xff\xfe")
            send(200, raw)
            return
        send(200, json.dumps(payload, ensure_ascii=False).encode("utf-8"))

    def _contents(self, request: dict, messages: list, n: int, first: str) -> list[str]:
        """The n choices; a repeated identical request at temperature > 0 (or unset) draws later samples."""
        temperature = request.get("temperature")
        repeat = 0
        if temperature is None or (isinstance(temperature, (int, float)) and temperature > 0):
            key = hashlib.sha256(json.dumps([request.get("model"), messages], sort_keys=True).encode()).hexdigest()
            with self._lock:
                repeat = self._repeats.get(key, 0)
                self._repeats[key] = repeat + 1
        samples = [repeat * n + i for i in range(n)]
        return [first if s == 0 else simulated_reply(messages, sample=s, seed=self.seed)[1] for s in samples]

    @staticmethod
    def _stream_body(response_id, created, model, contents, usage, request) -> bytes:
        base = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
        events = []
        for i, content in enumerate(contents):
            delta = {"role": "assistant", "content": content}
            events.append({**base, "choices": [{"index": i, "delta": delta, "finish_reason": None}]})
            events.append({**base, "choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]})
        if (request.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "choices": [], "usage": usage})
        text = "".join(f"data: {json.dumps(event, ensure_ascii=False)}\n\n" for event in events) + "data: [DONE]\n\n"
        return text.encode("utf-8")


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def _latency_arg(text: str) -> float | tuple[float, float]:
    if "," in text:
        low, high = text.split(",", 1)
        return float(low), float(high)
    return float(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dspy_opro.testing.server", description="Serve the simulated OpenAI-compatible model."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency", type=_latency_arg, default=0.0, help="seconds, or LOW,HIGH")
    parser.add_argument("--rate-limit", type=float, default=0.0)
    parser.add_argument("--retry-after", type=float, default=0.0)
    parser.add_argument("--server-error", type=float, default=0.0)
    parser.add_argument("--hang", type=float, default=0.0)
    parser.add_argument("--hang-seconds", type=float, default=30.0)
    parser.add_argument("--malformed", type=float, default=0.0)
    parser.add_argument("--empty-choices", type=float, default=0.0)
    parser.add_argument("--auth-error", action="store_true")
    parser.add_argument("--only-kinds", default=None, help="comma-separated kinds")
    parser.add_argument("--first-n", type=int, default=None)
    parser.add_argument("--fail-requests", default=None, help="comma-separated request indices")
    parser.add_argument("--fail-kind", default="server_error", choices=FAULT_KINDS)
    args = parser.parse_args(argv)

    faults = FaultConfig(
        rate_limit=args.rate_limit,
        retry_after=args.retry_after,
        server_error=args.server_error,
        hang=args.hang,
        hang_seconds=args.hang_seconds,
        malformed=args.malformed,
        empty_choices=args.empty_choices,
        auth_error=args.auth_error,
        only_kinds=set(args.only_kinds.split(",")) if args.only_kinds else None,
        first_n=args.first_n,
        fail_requests={int(i) for i in args.fail_requests.split(",")} if args.fail_requests else None,
        fail_kind=args.fail_kind,
    )
    done = threading.Event()

    def _on_signal(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    endpoint = SimulatedEndpoint(latency=args.latency, faults=faults, seed=args.seed, host=args.host, port=args.port)
    endpoint.start()
    try:
        print(f"listening on {endpoint.base_url}", flush=True)
        while not done.wait(0.5):
            pass
    finally:
        endpoint.stop()
    print(f"stopped after {endpoint.count(status=None)} requests", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
