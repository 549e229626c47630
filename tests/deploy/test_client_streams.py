"""The client's HTTP stream when the server stops mid-answer: Triton's generate_stream marks its end only by the
finish reason of its last event, so a stream cut short must be an error, not an answer that merely ends.

The server here is a real HTTP server in this process that sends a stream's first events and then stops, as a
killed Triton's connection does; a killed Triton itself is tested by the run command's tests."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deploy.client import GenerateParams, TritonClient, TritonUnavailable

EVENTS = [{"model_name": "m", "text_output": "a", "token_ids": 1},
          {"model_name": "m", "text_output": "b", "token_ids": 2}]
LAST = {"completion_tokens": 2, "finish_reason": "length", "prompt_tokens": 1, "text_output": "", "token_ids": []}


def _server(events: list[dict]) -> ThreadingHTTPServer:
    class Stream(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in events:
                data = f"data: {json.dumps(event)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            self.close_connection = True  # no closing chunk: the connection just ends

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def serve():
    servers = []

    def start(events):
        servers.append(_server(events))
        return TritonClient(f"http://127.0.0.1:{servers[-1].server_address[1]}")
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_stream_cut_off_before_its_last_event_is_an_error_after_the_tokens_it_brought(serve):
    chunks = serve(EVENTS).stream("m", GenerateParams("x", max_tokens=2), protocol="http")
    assert [next(chunks).text, next(chunks).text] == ["a", "b"]
    with pytest.raises(TritonUnavailable, match="ended the stream before its last response, after 2 tokens"):
        next(chunks)


def test_a_stream_that_ends_with_its_finish_reason_is_whole(serve):
    chunks = list(serve(EVENTS + [LAST]).stream("m", GenerateParams("x", max_tokens=2), protocol="http"))
    assert ["".join(c.text for c in chunks), chunks[-1].finish_reason] == ["ab", "length"]
