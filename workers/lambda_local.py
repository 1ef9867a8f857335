"""A local endpoint that speaks AWS Lambda's Invoke API and runs real Python handlers: try a
reward function (`reward.kind = "lambda"` with `reward.endpoint_url`) before deploying it, and
test the Lambda path without AWS. `rollart lambda-local --function score=my_mod:handler`.

It answers `POST /2015-03-31/functions/{name}/invocations` as Lambda does: 200 with the
handler's JSON result; 200 with `X-Amz-Function-Error: Unhandled` and {"errorMessage",
"errorType", "stackTrace"} when the handler raised; 404 ResourceNotFoundException for an
unknown function; 429 TooManyRequestsException beyond the function's concurrency (a reserved
concurrency, so throttling and retries can be exercised)."""

from __future__ import annotations

import importlib
import json
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

Handler = Callable[[object, object], object]
INVOKE_PATH = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")


def load_handler(target: str, code_dir: str | None = None) -> Handler:
    """'package.module:function' -> the function, imported from `code_dir` first (Lambda's
    task root: where the deployment package was unpacked)."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"handler {target!r}: expected 'module:function'")
    if code_dir is not None and str(Path(code_dir).resolve()) not in sys.path:
        sys.path.insert(0, str(Path(code_dir).resolve()))
    return getattr(importlib.import_module(module), name)


class LambdaLocal(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, functions: dict[str, Handler], port: int = 0, concurrency: int = 1000,
                 timeout_s: float = 60.0) -> None:
        super().__init__(("127.0.0.1", port), _Invocations)
        self.functions, self.concurrency, self.timeout_s = functions, concurrency, timeout_s
        self.running = 0
        self.invocations = 0
        self.throttled = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> LambdaLocal:
        threading.Thread(target=self.serve_forever, name="lambda-local", daemon=True).start()
        return self

    def admit(self) -> bool:
        with self._lock:
            if self.running >= self.concurrency:
                self.throttled += 1
                return False
            self.running += 1
            self.invocations += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.running -= 1


class _Invocations(BaseHTTPRequestHandler):
    server: LambdaLocal

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        event = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        match = INVOKE_PATH.match(self.path.split("?")[0])
        name = match and match.group(1).rsplit(":", 1)[-1]  # an ARN ends with the name
        handler = self.server.functions.get(name) if name else None
        if handler is None:
            self._answer(404, {"Type": "User", "message": f"Function not found: {name}"},
                         error_type="ResourceNotFoundException")
            return
        if not self.server.admit():
            self._answer(429, {"Type": "User", "message": "Rate Exceeded.",
                               "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded"},
                         error_type="TooManyRequestsException")
            return
        try:
            self._invoke(name, handler, event)
        finally:
            self.server.leave()

    def _invoke(self, name: str, handler: Handler, event: bytes) -> None:
        deadline = time.monotonic() + self.server.timeout_s
        context = SimpleNamespace(
            function_name=name, aws_request_id=str(uuid.uuid4()), memory_limit_in_mb=128,
            get_remaining_time_in_millis=lambda: int(max(deadline - time.monotonic(), 0) * 1000))
        try:
            result = handler(json.loads(event) if event else {}, context)
            payload = json.dumps(result)
        except Exception as err:
            self._answer(200, {"errorMessage": str(err), "errorType": type(err).__name__,
                               "stackTrace": traceback.format_tb(err.__traceback__)},
                         function_error="Unhandled")
            return
        self._answer(200, payload)

    def _answer(self, status: int, body: object, error_type: str | None = None,
                function_error: str | None = None) -> None:
        payload = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-Amz-Executed-Version", "$LATEST")
        if error_type:
            self.send_header("x-amzn-ErrorType", error_type)
        if function_error:
            self.send_header("X-Amz-Function-Error", function_error)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass
