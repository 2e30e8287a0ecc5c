"""Hostile clients of the time WebSocket against the server in both run modes (the Procfile's
gunicorn, and `python app.py`'s fallback server): ping and pong floods, and ten sockets that never
read. The attacks on the echo socket are in tests/live/test_socket_attacks_echo.py; what an attack must not
disturb is in socketattacks.py."""

import pytest
from socketattacks import (
    an_attack_hurts_only_its_own_sockets,
    target,  # noqa: F401 (the module's server, a fixture)
)


@pytest.mark.parametrize("name", ["ping flood", "pong flood", "ten time sockets that never read"])
def test_an_attack_hurts_only_its_own_sockets(target, name):
    an_attack_hurts_only_its_own_sockets(target, name)
