"""A simulated OpenAI-compatible chat-completions endpoint on 127.0.0.1, for tests, benchmarks and offline demos.

The real DSPy/LiteLLM client stack talks to it over HTTP; the replies come from
:func:`dspy_opro.testing.simulated.simulated_reply`, after the endpoint's responders (the one hook for answering
prompts the simulated model does not know, e.g. other optimizers' proposal prompts). Faults (429 with
Retry-After, 500, hangs, malformed JSON, empty choices, 401, a body cut short) and the behaviours of real local
servers (a 400 above an ``n`` cap, ``n`` ignored, usage of the first choice only, unclosed tags, slow generation)
can be injected deterministically (:mod:`dspy_opro.testing.faults`); the HTTP plumbing is
:mod:`dspy_opro.testing.transport`.

Example::

    with SimulatedEndpoint() as endpoint:
        lm = dspy.LM("openai/sim-model", api_base=endpoint.base_url, api_key="x", cache=False)
        ...
        endpoint.count(kind="task")

Command line (:mod:`dspy_opro.testing.__main__`): ``python -m dspy_opro.testing --port 8765 --latency 0.05``
prints ``listening on http://127.0.0.1:8765/v1`` and serves until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dspy_opro.testing.adapter_prompts import message_text
from dspy_opro.testing.faults import N_CAP_MESSAGE, REFUSALS, FaultConfig
from dspy_opro.testing.hashing import stable_unit
from dspy_opro.testing.proposer import unclosed_reply
from dspy_opro.testing.simulated import Responder, simulated_reply
from dspy_opro.testing.transport import RequestHandler, ThreadedServer

__all__ = ["RequestRecord", "SimulatedEndpoint", "count_tokens"]

_MODEL_ID = "sim-model"
_ODD_BYTES_MARK = "@@not-utf8@@"


@dataclass
class RequestRecord:
    """One request the endpoint received.

    ``kind`` is what the request asked (``task``, ``opro``, ``judge``, ``unknown``, or the kind a responder
    claimed it as); ``status`` the HTTP status sent (0 when the connection was closed without an answer, e.g. a
    hang cut short by ``stop()``); ``fault`` the injected fault's name or None (``"n_cap"`` for a 400 above the
    ``n`` cap). Token counts are whitespace-split words: the prompt's over all messages, the completion's summed
    over the choices actually sent (the truth, whatever ``usage`` said: ``reported_completion_tokens`` is what the
    answer's ``usage`` reported, smaller under ``usage_first_choice_only``); ``choices`` is how many were sent.
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
    choices: int = 0  # choices sent in the answer
    reported_completion_tokens: int = 0  # what the answer's usage said (usage_first_choice_only: the first choice's)
    unclosed: int = 0  # choices whose closing tag was left out (unclosed_tags)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def count_tokens(text: str) -> int:
    """The endpoint's deterministic token count: whitespace-separated words."""
    return len(text.split())


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class _Stopped(Exception):
    """The endpoint stopped while a request was waiting; close without answering."""


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
        responders: Asked in order, before the simulated model's own routing, to claim each request
            (``Responder``: return ``(kind, reply text)``, or None to pass):
            the hook for prompts the simulated model does not answer itself.

    Use as a context manager or call ``start()``/``stop()``. Routes: ``POST /v1/chat/completions``,
    ``GET /v1/models``; anything else gets a 404 JSON error. A choice longer than the request's ``max_tokens`` (or
    ``max_completion_tokens``) is cut there, with ``finish_reason: "length"``, as a real server's would be.

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
        responders: Sequence[Responder] = (),
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
        self.responders: tuple[Responder, ...] = tuple(responders)
        self.seed = seed
        self.host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._next_index = 0
        self._repeats: dict[str, int] = {}
        self._stopping = threading.Event()
        self._server: ThreadedServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> SimulatedEndpoint:
        if self._server is not None:
            raise RuntimeError("endpoint already started")
        self._stopping.clear()
        self._server = ThreadedServer((self.host, self._requested_port), self._handle)
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

    def __exit__(self, *exc_info: object) -> None:
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
            return low + (high - low) * stable_unit("latency", self.seed, index)
        return self.latency

    def _handle(self, handler: RequestHandler, method: str) -> None:
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

    def _respond(self, handler: RequestHandler, method: str, path: str, body: bytes, record: RequestRecord) -> None:
        def send(
            status: int, payload: bytes, content_type: str = "application/json", headers: Iterable[tuple[str, str]] = ()
        ) -> None:
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
        texts = [message_text(m.get("content")) for m in messages if isinstance(m, dict)]
        record.prompt_tokens = sum(count_tokens(text) for text in texts)
        kind, first = self._reply(messages, 0)
        record.kind = kind

        faults = self.faults
        fault = record.fault = "auth_error" if faults.auth_error else faults.choose(record.index, kind, self.seed)
        if fault in REFUSALS:
            status, message, type_, code = REFUSALS[fault]
            send(status, _error_body(message, type_, code))
            return
        if faults.n_cap is not None and n > faults.n_cap:
            record.fault = "n_cap"
            message = N_CAP_MESSAGE.format(cap=faults.n_cap, n=n)
            refusal = {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}  # llama.cpp's shape
            send(400, json.dumps(refusal).encode())
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
        served_n = 1 if faults.ignore_n else n
        contents = [] if fault == "empty_choices" else self._contents(request, messages, served_n, first)
        if fault == "one_choice":
            contents = contents[:1]
        for choice, content in enumerate(contents):
            if faults.leaves_unclosed(record.index, kind, self.seed, choice):
                contents[choice] = unclosed_reply(content, sample=choice, seed=self.seed)
                record.unclosed += 1
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        cut = [isinstance(limit, int) and count_tokens(content) > limit for content in contents]
        if isinstance(limit, int) and limit > 0:  # a real server never generates more than max_tokens
            contents = [" ".join(content.split()[:limit]) if over else content
                        for content, over in zip(contents, cut, strict=True)]
        record.choices = len(contents)
        record.completion_tokens = sum(count_tokens(content) for content in contents)
        reported = record.completion_tokens
        if faults.usage_first_choice_only and len(contents) > 1:
            reported = count_tokens(contents[0])
        record.reported_completion_tokens = reported
        if faults.seconds_per_token:
            self._wait(faults.seconds_per_token * record.completion_tokens)
        usage: dict[str, Any] = {
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": reported,
            "total_tokens": record.prompt_tokens + reported,
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
                    "message": {"role": "assistant", "content": None if fault == "null_content" else content},
                    "logprobs": None,
                    "finish_reason": "length" if i < len(cut) and cut[i] else "stop",
                }
                for i, content in enumerate(contents)
            ],
            "usage": usage,
        }
        if fault == "no_usage":
            del payload["usage"]
        if fault == "negative_usage":
            payload["usage"] = {"prompt_tokens": -1000, "completion_tokens": -100, "total_tokens": -1100}
        if fault == "malformed_usage":  # the usage object arrives, the choices break off: not JSON as a whole
            head = json.dumps({key: value for key, value in payload.items() if key != "choices"}, ensure_ascii=False)
            send(200, (head[:-1] + ', "choices": [{"index": 0, "mess').encode("utf-8"))
            return
        if fault in ("odd_text", "invalid_utf8"):  # ASCII JSON escapes the surrogate and the NUL
            raw = json.dumps(payload).encode("ascii").replace(_ODD_BYTES_MARK.encode(), b"\xff\xfe")
            send(200, raw)
            return
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        if fault == "truncated_body":
            record.status, record.finished = 200, time.monotonic()
            self._send_cut_short(handler, body)
            return
        send(200, body)

    @staticmethod
    def _send_cut_short(handler: RequestHandler, body: bytes) -> None:
        """A 200 whose headers promise the whole body but whose connection closes after half of it."""
        head = (f"HTTP/1.1 200 OK\r\nServer: {handler.server_version}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        handler.close_connection = True
        handler.connection.sendall(head.encode("latin-1") + body[: len(body) // 2])

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
        return [first if s == 0 else self._reply(messages, s)[1] for s in samples]

    def _reply(self, messages: list, sample: int) -> tuple[str, str]:
        return simulated_reply(messages, sample=sample, seed=self.seed, responders=self.responders)

    @staticmethod
    def _stream_body(
        response_id: str, created: int, model: str, contents: list[str], usage: dict[str, Any], request: dict
    ) -> bytes:
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


if __name__ == "__main__":
    sys.exit("The endpoint's command line is: python -m dspy_opro.testing --help")
