"""The Outbox (ws/outbox.py) on real (gevent) socket pairs, plain and under TLS: what it queues for
a peer that reads nothing, its limits and stall timeout, its close, and send_to_each (the time
socket's tick)."""

import datetime

import gevent
import gevent.event
import gevent.socket
import gevent.ssl
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from wsservers import read_exactly, socket_pair, wait_until

from ws.outbox import ENTRY_OVERHEAD, Outbox, OutputFull, send_to_each

MIB = 1024 * 1024


def send_to_a_peer_that_reads_only_afterwards(server, client, stall_timeout):
    """Send 4 MiB through an Outbox on server while client reads nothing, then read it all there;
    return the outbox."""
    outbox = Outbox(server, 8 * MIB, stall_timeout=stall_timeout, on_stall=pytest.fail)
    frames = [bytes([i]) * 65536 for i in range(64)]
    # A send that waited for the peer would wait for ever: the peer reads only afterwards.
    with gevent.Timeout(30):
        for data in frames:
            outbox.send(data)
    assert outbox.pending_bytes > 2 * MIB
    assert read_exactly(client, 64 * 65536) == b"".join(frames)
    return outbox


def test_a_send_to_a_peer_that_reads_nothing_returns_at_once_and_arrives_later_in_order(pair):
    outbox = send_to_a_peer_that_reads_only_afterwards(*pair, stall_timeout=5)
    gevent.sleep(0)
    assert outbox.pending_bytes == 0 and not outbox.pending


def test_a_peer_that_takes_nothing_is_cut_off_after_the_stall_timeout(pair):
    server, client = pair
    stalls = []

    def give_up():
        stalls.append(True)
        outbox.abort(b"bye")

    outbox = Outbox(server, MIB, stall_timeout=0.3, on_stall=give_up)
    for _ in range(8):
        outbox.send(b"y" * 65536)
    wait_until(lambda: stalls)
    assert stalls == [True]
    assert outbox.closed and outbox.pending_bytes == 0 and not outbox.pending
    with pytest.raises(BrokenPipeError):
        outbox.send(b"more")


def test_tiny_frames_count_with_what_each_costs_besides_its_bytes(pair):
    server, _ = pair
    outbox = Outbox(server, 256 * 1024, stall_timeout=30, on_stall=pytest.fail)
    while not outbox.pending:
        outbox.send(b"f" * 4096)
    for _ in range(1000):
        outbox.send(b"\x8a\x00")  # an empty pong
    assert outbox.pending_bytes >= 1000 * (2 + ENTRY_OVERHEAD)
    assert outbox.fits(1000) is (outbox.pending_bytes + 1000 + ENTRY_OVERHEAD <= 256 * 1024)


def test_wait_for_room_waits_and_never_lets_the_limit_pass(pair):
    server, client = pair
    outbox = Outbox(server, 256 * 1024, stall_timeout=30, on_stall=pytest.fail)
    peak = []

    def writer():
        for _ in range(64):
            outbox.wait_for_room(16384)
            outbox.send(b"w" * 16384)
            peak.append(outbox.pending_bytes)

    greenlet = gevent.spawn(writer)
    gevent.sleep(0.2)
    assert not greenlet.dead, "the writer should be waiting for room"
    assert read_exactly(client, 64 * 16384) == b"w" * 64 * 16384
    greenlet.join(timeout=30)
    assert greenlet.successful()
    assert max(peak) <= 256 * 1024


def test_a_frame_larger_than_the_limit_waits_only_for_an_empty_queue(pair):
    server, client = pair
    outbox = Outbox(server, 64 * 1024, stall_timeout=30, on_stall=pytest.fail)
    outbox.send(b"a" * 200_000)
    greenlet = gevent.spawn(outbox.wait_for_room, 100_000)
    read_exactly(client, 200_000)
    assert greenlet.get(timeout=30) is True


def test_a_failed_connection_closes_the_outbox(pair):
    server, client = pair
    outbox = Outbox(server, MIB, stall_timeout=30, on_stall=pytest.fail)
    client.close()
    with pytest.raises(BrokenPipeError):
        for _ in range(100):
            outbox.send(b"x" * 65536)
            gevent.sleep(0.01)
    assert outbox.closed


def test_close_waits_for_what_is_queued(pair):
    server, client = pair
    outbox = Outbox(server, 8 * MIB, stall_timeout=5, on_stall=pytest.fail)
    for _ in range(16):
        outbox.send(b"c" * 65536)
    outbox.close()
    assert not outbox.closed
    assert read_exactly(client, 16 * 65536) == b"c" * 16 * 65536
    wait_until(lambda: outbox.closed)
    assert outbox.closed and client.recv(1) == b""


def test_a_limited_send_refuses_a_frame_that_would_queue_past_the_limit_but_sends_one_alone(pair):
    server, client = pair
    outbox = Outbox(server, 256 * 1024, stall_timeout=5, on_stall=pytest.fail)
    outbox.send(b"x" * MIB, limited=True)  # alone, it goes out as the client reads it
    assert outbox.pending
    with pytest.raises(OutputFull):
        outbox.send(b"frame", limited=True)
    assert read_exactly(client, MIB) == b"x" * MIB
    wait_until(lambda: not outbox.pending)
    outbox.send(b"frame", limited=True)
    assert read_exactly(client, 5) == b"frame"


def test_send_to_each_sends_as_a_limited_send_would_and_returns_each_refusal():
    pairs = [socket_pair() for _ in range(4)]
    ready, sealed, behind, aborted = (Outbox(server, 256 * 1024, stall_timeout=5, on_stall=pytest.fail)
                                      for server, _ in pairs)
    sealed.seal()
    behind.send(b"x" * MIB)  # its client reads nothing yet: the rest of it waits in the queue
    aborted.abort()
    refused = send_to_each([ready, sealed, behind, aborted], b"tick")
    assert [(outbox, type(error)) for outbox, error in refused] == [
        (sealed, BrokenPipeError), (behind, OutputFull), (aborted, BrokenPipeError)]
    assert read_exactly(pairs[0][1], 4) == b"tick" and not ready.pending
    assert read_exactly(pairs[2][1], MIB) == b"x" * MIB
    for server, client in pairs:
        server.close()
        client.close()


def test_send_to_each_queues_what_the_kernel_does_not_take_and_sends_straight_again_once_it_is_out(pair):
    server, client = pair
    outbox = Outbox(server, 8 * MIB, stall_timeout=5, on_stall=pytest.fail)
    frame = b"f" * (2 * MIB)
    assert send_to_each([outbox], frame) == [] and outbox.pending and not outbox.ready
    assert read_exactly(client, 2 * MIB) == frame
    wait_until(lambda: not outbox.pending)
    assert outbox.ready
    assert send_to_each([outbox], b"tock") == [] and not outbox.pending
    assert read_exactly(client, 4) == b"tock"


def test_an_outbox_sealed_or_closing_while_it_queued_is_not_ready_once_the_queue_is_out(pair):
    server, client = pair
    outbox = Outbox(server, 8 * MIB, stall_timeout=5, on_stall=pytest.fail)
    outbox.send(b"s" * (2 * MIB))
    outbox.seal()
    assert read_exactly(client, 2 * MIB) == b"s" * (2 * MIB)
    wait_until(lambda: not outbox.pending)
    assert not outbox.ready
    with pytest.raises(BrokenPipeError):
        outbox.send(b"after the seal")


def test_an_outbox_with_nothing_queued_holds_no_queue(pair):
    """An empty deque takes 0.7 KiB, and a worker holds thousands of outboxes, nearly all empty."""
    server, client = pair
    outbox = Outbox(server, MIB, stall_timeout=5, on_stall=pytest.fail)
    assert outbox.pending == () and not hasattr(outbox, "__dict__")
    outbox.send(b"x" * (4 * MIB))
    assert len(outbox.pending) == 1
    assert read_exactly(client, 4 * MIB) == b"x" * (4 * MIB)
    wait_until(lambda: outbox.pending == ())


def test_a_send_that_completes_after_the_outbox_was_aborted_ends_the_flusher_quietly():
    """gevent closes a socket in a callback of its loop, so a flusher's send may still succeed
    after another greenlet's abort() dropped the queue."""
    class SlowSocket:
        """Not a plain socket: its send waits unless its own timeout is 0, as a TLS socket's does."""

        timeout = None

        def gettimeout(self):
            return self.timeout

        def settimeout(self, timeout):
            self.timeout = timeout

        def send(self, data):
            if self.timeout == 0.0:
                return 0  # the kernel takes nothing at once: the frame is queued
            outbox.abort()  # another greenlet aborts while this send waits
            return len(data)

        def close(self):
            pass

    outbox = Outbox(SlowSocket(), MIB, stall_timeout=5, on_stall=pytest.fail)
    outbox.send(b"frame")
    flusher = outbox.flusher
    flusher.join(timeout=30)
    assert flusher.successful() and outbox.closed and outbox.pending == ()


def test_the_outbox_writes_to_the_real_socket_only_when_it_is_a_plain_one(pair):
    plain, _ = pair
    assert Outbox(plain, MIB, stall_timeout=5, on_stall=pytest.fail).send_now == plain._sock.send


def tls_pair(tmp_path):
    """A (server, client) pair of gevent TLS sockets over a socket pair, handshaken, the server's
    timeout None as Server.handshake leaves it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                   .sign(key, hashes.SHA256()))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    server_context = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    client_context = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_CLIENT)
    client_context.check_hostname = False
    client_context.verify_mode = gevent.ssl.CERT_NONE
    server_sock, client_sock = socket_pair()
    client = gevent.spawn(client_context.wrap_socket, client_sock)
    server = server_context.wrap_socket(server_sock, server_side=True)
    server.settimeout(None)
    return server, client.get(timeout=30)


def test_under_tls_a_send_to_a_peer_that_reads_nothing_returns_at_once_and_arrives_later_in_order(tmp_path):
    server, client = tls_pair(tmp_path)
    with server, client:
        outbox = send_to_a_peer_that_reads_only_afterwards(server, client, stall_timeout=30)
        wait_until(lambda: not outbox.pending)
