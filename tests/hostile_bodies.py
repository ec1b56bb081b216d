"""The pod-side server of hostile status answers, one source for the tests that need it
(test_hostile_pods.py, the campaign's hostile-status scenario): Python source that defines
`serve_hostile(listener)`, which answers every read of the launcher's status port, in turn,
with a 2^64 - 1 step, a NaN rate, 64 KiB of nested brackets and 64 KiB of empty objects (and,
with `more`, bytes that are no JSON and a body held back 5 s, past the reader's timeout)."""

from __future__ import annotations

STEP = 2**64 - 1  # past any int64: the operator must refuse it, not wrap or crash

_SOURCE = """
def serve_hostile(listener):
    import http.server, itertools, json, threading, time
    # Bound to no attempt (the sidecar cannot know the rendezvous id): what is refused is
    # the content, before any binding is looked at.
    bind = {"v": 1, "rdzvId": "sidecar", "index": INDEX}
    bodies = [
        json.dumps({**bind, "state": "Training", "groupRank": 0, "ranks": [INDEX],
                    "progress": {"step": STEP}}).encode(),
        json.dumps({**bind, "progress": {"stepsPerSecond": float("nan")}}).encode(),
        b"[" * 32768 + b"]" * 32767,
        json.dumps(bind)[:-1].encode() + b',"x":[' + b",".join([b"{}"] * 21000) + b"]}",
    ]
    if MORE:
        bodies += [b"\\xff\\xfe{not json" * 100, b"slow"]
    bodies = itertools.cycle(bodies)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = next(bodies)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            if body == b"slow":
                time.sleep(5)
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

    server = Server(("0.0.0.0", 0), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    threading.Thread(target=server.serve_forever, daemon=True).start()
"""


def hostile_server(index: int, more: bool = False) -> str:
    """The source of `serve_hostile`, for a pod of this index (`ranks` in its answers)."""
    return (
        _SOURCE.replace("INDEX", str(index)).replace("STEP", str(STEP)).replace("MORE", str(more))
    )
