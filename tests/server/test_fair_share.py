"""No client can take the gateway from the others. A client (its API key, else
its address: here 127.0.0.2 to .6, all this machine) has a cap on its streams and on its
WebSockets, all clients on their WebSockets together, and a silent socket is closed; past a cap,
503 with Retry-After, and the other clients are served. The side gateway (conftest.SIDE_GATEWAY_ENV:
4 streams and 3 sockets a client, 5 sockets in all, idle after 2 s, refusals sent after 0.5 s) in
front of the shared server."""
from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import urllib.parse

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.server
BODY = {"model": "tts-1", "voice": "amber", "response_format": "pcm", "max_new_tokens": 200}


def request(gw: str, source: str, text: str, **extra) -> http.client.HTTPResponse:
    """A POST from the address `source`, its response begun (its body not read)."""
    u = urllib.parse.urlsplit(gw)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60, source_address=(source, 0))
    conn.request("POST", "/v1/audio/speech", json.dumps(BODY | {"input": text} | extra),
                 {"Content-Type": "application/json"})
    return conn.getresponse()


def test_a_client_past_its_streams_gets_503_and_the_others_are_served(side_gw):
    gw, _ = side_gw
    # six sentences of up to 200 frames each (the demo's random weights rarely end sooner): more
    # audio than the socket buffers hold while the client reads 1 KiB. A stream that ended into
    # them would free its place, and the fifth request would be served
    held = [request(gw, "127.0.0.2", f"Number {i}: one. Two. Three. Four. Five. Six.") for i in range(4)]
    assert all(r.status == 200 and r.read1(1024) for r in held), [(r.status, r.read(300)) for r in held]
    r = request(gw, "127.0.0.2", "One more.")
    err = json.loads(r.read())["error"]
    assert r.status == 503 and r.getheader("Retry-After") == "2" and err["code"] == "client_busy", err
    assert "VELOCITY_GATEWAY_MAX_STREAMS_PER_CLIENT" in err["message"], err
    # a refusal is cheap: sent before the body is read (here never sent), after the refusal delay,
    # so that a client asking again at once waits instead of spending the gateway's CPU
    u = urllib.parse.urlsplit(gw)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30, source_address=("127.0.0.2", 0))
    t = time.monotonic()
    conn.putrequest("POST", "/v1/audio/speech")
    for k, v in {"Content-Type": "application/json", "Content-Length": "100000"}.items():
        conn.putheader(k, v)
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 503 and json.loads(r.read())["error"]["code"] == "client_busy"
    assert time.monotonic() - t >= 0.5
    conn.close()
    other = request(gw, "127.0.0.3", "Someone else.")                   # another client: served
    assert other.status == 200 and len(other.read()) > 0
    for r in held:
        r.close()


def test_the_engine_is_told_which_client_each_stream_is_for(side_gw, tts_server):
    """The gateway names each stream's client to the server (CLIENT), and the engine counts its
    clients (velocity_engine_clients): two addresses with streams held open are two clients."""
    from triton_server import wait_for

    gw, _ = side_gw
    text = "Held open: one. Two. Three. Four. Five. Six."
    clients = lambda: tts_server.metric("velocity_engine_clients")   # noqa: E731
    one = [request(gw, "127.0.0.5", text) for _ in range(2)]
    assert all(r.status == 200 and r.read1(1024) for r in one), [(r.status, r.read(300)) for r in one]
    assert wait_for(lambda: clients() == 1, 30), clients()         # two streams of one client
    two = request(gw, "127.0.0.6", text)
    assert two.status == 200 and two.read1(1024), two.read(300)
    assert wait_for(lambda: clients() == 2, 30), clients()
    for r in [*one, two]:
        r.close()
    assert wait_for(lambda: clients() == 0, 30), clients()


def ws_from(gw: str, source: str):
    host, port = gw.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), source_address=(source, 0))
    return connect(gw.replace("http://", "ws://") + "/v1/audio/speech/stream", sock=s, close_timeout=1)


def refused(gw: str, source: str) -> dict:
    with pytest.raises(InvalidStatus) as e:
        ws_from(gw, source)
    r = e.value.response
    assert r.status_code == 503 and r.headers["Retry-After"] == "2", r
    return json.loads(r.body)["error"]


def test_sockets_are_capped_per_client_and_in_all(side_gw):
    gw, _ = side_gw
    with contextlib.ExitStack() as open_:
        for _ in range(3):
            open_.enter_context(ws_from(gw, "127.0.0.2"))
        assert "VELOCITY_GATEWAY_MAX_SOCKETS_PER_CLIENT" in refused(gw, "127.0.0.2")["message"]
        for _ in range(2):
            open_.enter_context(ws_from(gw, "127.0.0.3"))                # 5 in all
        assert "VELOCITY_GATEWAY_MAX_SOCKETS" in refused(gw, "127.0.0.4")["message"]
    with ws_from(gw, "127.0.0.4"):                                     # closed: room again
        pass


def test_a_silent_socket_is_closed(side_gw):
    gw, _ = side_gw
    with ws_from(gw, "127.0.0.4") as ws:
        t = time.monotonic()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
    assert ws.close_code == 1000 and "idle for 2 s" in ws.close_reason and time.monotonic() - t < 10
