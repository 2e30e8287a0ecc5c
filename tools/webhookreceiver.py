"""A webhook receiver for trying webhooks on your own machine (docs/webhooks.md): it prints each
delivery and answers 200, or 500 from `GET /fail` until `GET /ok`. The standard library only.

    python -m tools.webhookreceiver [PORT]      # default 9000, on 127.0.0.1
"""

import http.server
import sys
import threading
import time

# The service sends bodies of a few hundred bytes; anything larger is cut here, not read whole.
MAX_BODY = 64 * 1024


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address):
        super().__init__(address, Handler)
        self.status = 200
        self.lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = self.headers.get("Content-Length", "0")
        body = self.rfile.read(min(int(length), MAX_BODY)) if length.isdigit() else b""
        status = self.server.status
        with self.server.lock:  # one delivery's lines together, whatever arrives beside it
            print(f"{time.strftime('%H:%M:%S')} POST {self.path} webhook-id: {self.headers.get('webhook-id')}"
                  f" -> {status}", flush=True)
            print(f"  {body.decode(errors='replace')}", flush=True)
        self.answer(status, b"")

    def do_GET(self):
        """GET /fail: answer every delivery 500 from now on; GET /ok: 200 again."""
        if self.path in ("/fail", "/ok"):
            self.server.status = 500 if self.path == "/fail" else 200
            with self.server.lock:
                print(f"{time.strftime('%H:%M:%S')} deliveries are answered {self.server.status} from now on",
                      flush=True)
            self.answer(200, f"Deliveries are answered {self.server.status} from now on.\n".encode())
        else:
            self.answer(404, b"GET /fail or /ok; deliveries are POSTs.\n")

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # the lines above say what came


def main(argv):
    port = int(argv[0]) if argv else 9000
    server = Receiver(("127.0.0.1", port))
    print(f"Receiving webhooks at http://127.0.0.1:{port} (GET /fail: answer them 500; GET /ok: 200)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
