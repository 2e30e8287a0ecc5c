"""A connected pair of real (gevent) sockets for the WebSocket adapter's tests."""

import pytest
from wsservers import socket_pair


@pytest.fixture
def pair():
    server, client = socket_pair()
    yield server, client
    server.close()
    client.close()
