"""The serving front ends: an OpenAI-style HTTP endpoint for online requests, and a batch-file
(JSONL) interface for offline ones, over one `Scheduler` driven by one engine thread.

HTTP (stdlib `http.server`, one thread per connection):

    POST /v1/completions   {"prompt": "text" | [token ids], "max_tokens": 16}
        -> {"id", "object": "text_completion", "model", "choices": [{"text", "tokens",
            "index": 0, "finish_reason": "length"}], "usage": {...}, "timing": {...}}
    POST /v1/batches       {"requests": [{"prompt", "max_tokens", "id"?}...]} -> offline, queued
    GET  /v1/batches/<id>  -> the batch's status and, once done, its results
    GET  /health           -> {"status": "ok", ...}

Text is tokenized by a byte tokenizer (one token per UTF-8 byte, vocabulary 256). Errors are
JSON `{"error": {"message", "type"}}` with status 400 (malformed JSON, unknown fields, bad
values, a prompt too long for the context), 404, or 503 (a request that failed, e.g. its
checkpoint was lost).
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .request import FAILED, OFFLINE, ONLINE, Request

COMPLETION_FIELDS = {"prompt", "max_tokens", "model", "temperature", "stream", "id"}


class BadRequest(Exception):
    pass


def encode_text(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode_tokens(tokens: list[int]) -> str:
    return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", errors="replace")


def parse_completion(body: dict, vocab: int, default_max_tokens: int = 16) -> tuple[list[int], int]:
    """Validates an OpenAI-style completion request; returns (prompt tokens, max_tokens)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = set(body) - COMPLETION_FIELDS
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(COMPLETION_FIELDS))})")
    if "prompt" not in body:
        raise BadRequest("missing field: prompt (a string, or a list of token ids)")
    p = body["prompt"]
    if isinstance(p, str):
        tokens = encode_text(p)
    elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        tokens = p
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} outside the vocabulary [0, {vocab})")
    else:
        raise BadRequest("prompt must be a string or a list of integer token ids")
    if not tokens:
        raise BadRequest("prompt is empty")
    mt = body.get("max_tokens", default_max_tokens)
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        raise BadRequest("max_tokens must be a positive integer")
    if body.get("temperature", 0) not in (0, 0.0):
        raise BadRequest("only greedy decoding is served: temperature must be 0")
    if body.get("stream", False):
        raise BadRequest("streaming is not supported")
    return tokens, mt


class Service:
    """A scheduler plus the engine thread that steps it in real time."""

    def __init__(self, scheduler, model_name: str, vocab: int, request_timeout: float = 300.0):
        self.sched = scheduler
        self.model_name = model_name
        self.vocab = vocab
        self.timeout = request_timeout
        self.stop = threading.Event()
        self.thread = threading.Thread(target=scheduler.serve_forever, args=(self.stop,), name="engine", daemon=True)
        self.batches: dict[str, list[Request]] = {}
        self._batch_ids = itertools.count(1)
        self._ids = itertools.count(1)

    def start(self):
        self.thread.start()
        return self

    def shutdown(self):
        self.stop.set()
        self.thread.join(timeout=10)

    def complete(self, prompt: list[int], max_tokens: int) -> Request:
        """Submits an online request and waits for it."""
        r = Request(prompt=prompt, max_tokens=max_tokens, kind=ONLINE, rid=f"cmpl-{next(self._ids)}")
        r.event = threading.Event()
        self.sched.submit(r)  # ValueError for a prompt too long
        if not r.event.wait(self.timeout):
            raise TimeoutError(f"request {r.rid} not finished within {self.timeout} s")
        return r

    def submit_batch(self, items: list[dict]) -> tuple[str, list[Request]]:
        reqs = []
        for i, it in enumerate(items):
            if not isinstance(it, dict):
                raise BadRequest(f"request {i}: must be a JSON object")
            prompt, mt = parse_completion(it, self.vocab)
            rid = str(it.get("id", f"req-{i}"))
            reqs.append(Request(prompt=prompt, max_tokens=mt, kind=OFFLINE, rid=rid))
        limit = self.sched.max_context
        for r in reqs:
            if limit is not None and len(r.prompt) + r.max_tokens > limit:
                raise BadRequest(f"request {r.rid}: prompt of {len(r.prompt)} tokens plus max_tokens {r.max_tokens} exceeds the context of {limit} tokens")
        bid = f"batch-{next(self._batch_ids)}"
        for r in reqs:
            r.event = threading.Event()
            self.sched.submit(r)
        self.batches[bid] = reqs
        return bid, reqs


def result_record(r: Request) -> dict:
    rec = {"id": r.rid, "tokens": list(r.output), "text": decode_tokens(r.output), "status": r.state}
    if r.state == FAILED:
        rec["error"] = r.error
    return rec


def make_handler(service: Service):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet by default
            pass

        def _send(self, status: int, obj: dict):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, msg: str, kind: str = "invalid_request_error"):
            self._send(status, {"error": {"message": msg, "type": kind}})

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                return json.loads(raw or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise BadRequest(f"malformed JSON: {e}")

        def do_GET(self):
            if self.path == "/health":
                s = service.sched
                return self._send(200, {"status": "ok", "model": service.model_name, "running": len(s.running),
                                        "online_queue": len(s.online_queue), "offline_queue": len(s.offline_queue)})
            if self.path.startswith("/v1/batches/"):
                reqs = service.batches.get(self.path.rsplit("/", 1)[-1])
                if reqs is None:
                    return self._error(404, "no such batch", "not_found")
                done = all(r.done for r in reqs)
                body = {"id": self.path.rsplit("/", 1)[-1], "status": "completed" if done else "in_progress",
                        "finished": sum(r.done for r in reqs), "total": len(reqs)}
                if done:
                    body["results"] = [result_record(r) for r in reqs]
                return self._send(200, body)
            self._error(404, f"no route GET {self.path}", "not_found")

        def do_POST(self):
            try:
                if self.path == "/v1/completions":
                    prompt, mt = parse_completion(self._body(), service.vocab)
                    try:
                        r = service.complete(prompt, mt)
                    except ValueError as e:
                        raise BadRequest(str(e))
                    if r.state == FAILED:
                        return self._error(503, f"request failed: {r.error}", "server_error")
                    return self._send(200, {
                        "id": r.rid, "object": "text_completion", "model": service.model_name,
                        "choices": [{"index": 0, "text": decode_tokens(r.output), "tokens": list(r.output), "finish_reason": "length"}],
                        "usage": {"prompt_tokens": len(r.prompt), "completion_tokens": len(r.output), "total_tokens": r.seq_len},
                        "timing": {"ttft_s": r.ttft, "tpot_s": r.tpot}})
                if self.path == "/v1/batches":
                    body = self._body()
                    if not isinstance(body, dict) or set(body) - {"requests"} or not isinstance(body.get("requests"), list):
                        raise BadRequest('expected {"requests": [...]} and nothing else')
                    bid, reqs = service.submit_batch(body["requests"])
                    return self._send(200, {"id": bid, "status": "in_progress", "total": len(reqs)})
                self._error(404, f"no route POST {self.path}", "not_found")
            except BadRequest as e:
                self._error(400, str(e))
            except TimeoutError as e:
                self._error(504, str(e), "timeout")

    return Handler


def serve_http(service: Service, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """Starts the HTTP server in a thread; returns it (`.server_address`, `.shutdown()`)."""
    httpd = ThreadingHTTPServer((host, port), make_handler(service))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    return httpd


def run_batch_file(scheduler, lines, vocab: int, default_max_tokens: int = 16):
    """Offline batch: JSONL requests in ({"prompt", "max_tokens", "id"}), JSONL results out, in
    input order. Runs `scheduler` until all are done; yields one result dict per line."""
    reqs = []
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadRequest(f"line {i + 1}: malformed JSON: {e}")
        try:
            prompt, mt = parse_completion(body, vocab, default_max_tokens)
        except BadRequest as e:
            raise BadRequest(f"line {i + 1}: {e}")
        r = Request(prompt=prompt, max_tokens=mt, kind=OFFLINE, rid=str(body.get("id", f"line-{i + 1}")))
        try:
            scheduler.submit(r)
        except ValueError as e:
            raise BadRequest(f"line {i + 1}: {e}")
        reqs.append(r)
    while scheduler.step():
        pass
    for r in reqs:
        yield result_record(r)
