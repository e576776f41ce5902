"""A real HTTP server, run in its own process, that records every POST it receives as one JSON
line (path, parsed body, arrival time) and answers as told: ``ok`` (202, as PagerDuty does),
``error`` (500) or ``hang`` (reads the request, never answers).

    python alert_server.py --mode ok --record posts.jsonl --port-file port
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("ok", "error", "hang"), default="ok")
    p.add_argument("--record", type=Path, required=True)
    p.add_argument("--port-file", type=Path, required=True)
    args = p.parse_args()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            with lock, open(args.record, "a") as out:
                out.write(json.dumps({"path": self.path, "body": parsed, "time": time.time(),
                                      "content_type": self.headers.get("Content-Type"),
                                      "idempotency_key": self.headers.get("Idempotency-Key")}) + "\n")
            if args.mode == "hang":
                time.sleep(3600)
            self.send_response(202 if args.mode == "ok" else 500)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.rename(args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
