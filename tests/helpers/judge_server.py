"""A tiny OpenAI-compatible chat-completions server for the judge tests (run as a script).

Answers yes when the reference text occurs in the answer, no otherwise, except for answers
that ask for trouble: ``SLOW`` (replies after 3 s), ``GARBAGE`` (a verdict that is neither yes
nor no), ``NOTJSON`` (an HTML body), ``FLAKY`` (HTTP 503 the first time, then a verdict).
``GET /stats`` returns the requests seen per answer and the most requests in flight at once.
Prints its port on the first line of stdout.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_lock = threading.Lock()
_seen: Counter[str] = Counter()
_in_flight = 0
_max_in_flight = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_: object) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        with _lock:
            stats = {"seen": dict(_seen), "max_in_flight": _max_in_flight}
        self._send(200, json.dumps(stats).encode())

    def do_POST(self) -> None:
        global _in_flight, _max_in_flight
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        reference = re.search(r"Reference answer: (.*)\n", prompt).group(1)
        answer = re.search(r"\nAnswer: (.*)\n", prompt).group(1)
        with _lock:
            _seen[answer] += 1
            attempt = _seen[answer]
            _in_flight += 1
            _max_in_flight = max(_max_in_flight, _in_flight)
        try:
            time.sleep(0.2)  # a little work, so concurrent requests overlap
            if "SLOW" in answer:
                time.sleep(3)
            if "NOTJSON" in answer:
                return self._send(200, b"<html>oops</html>", "text/html")
            if "FLAKY" in answer and attempt == 1:
                return self._send(503, b'{"error": "overloaded"}')
            verdict = (
                "Perhaps."
                if "GARBAGE" in answer
                else ("Yes." if reference.lower() in answer.lower() else "No.")
            )
            reply = {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
            self._send(200, json.dumps(reply).encode())
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (time-out)
            pass
        finally:
            with _lock:
                _in_flight -= 1


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
