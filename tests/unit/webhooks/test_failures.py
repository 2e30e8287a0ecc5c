"""webhooks/failures.py: every way an attempt can fail said in a few words on one line, cut to the
column that keeps it."""

import http.client
import socket
import ssl

import pytest

from webhooks import addresses, failures
from webhooks.models import WebhookAttempt


@pytest.mark.parametrize("failure, text", [
    (http.client.RemoteDisconnected("Remote end closed connection without response"),
     "Connection closed without an answer."),
    (http.client.BadStatusLine("hello\r\n"), "The answer is not HTTP: its status line cannot be read."),
    (http.client.LineTooLong("header line"), "The answer's head has a line too long."),
    (http.client.IncompleteRead(b""), "The answer was cut short."),
    (ConnectionRefusedError(111, "Connection refused"), "Connection refused."),
    (ConnectionResetError(104, "Connection reset by peer"), "Connection reset."),
    (ConnectionAbortedError(103, "Software caused connection abort"), "Connection aborted."),
    (BrokenPipeError(32, "Broken pipe"), "Connection closed while the request was sent."),
    (socket.gaierror(-2, "Name or service not known"), "Network error: Name or service not known."),
    (OSError(113, "No route to host"), "Network error: No route to host."),
    (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
     "TLS failed: EOF occurred in violation of protocol."),
    (ssl.SSLCertVerificationError(1, "certificate verify failed"),
     "TLS certificate not accepted: certificate verify failed."),
    (UnicodeError("label too long"), "The host name cannot be encoded."),
    (addresses.RefusedAddress("The host 'x.invalid' cannot be resolved."), "The host 'x.invalid' cannot be resolved."),
    (http.client.UnknownProtocol("HTTP/9\r\nX: \x00"), "The answer is not valid HTTP/1.1 (HTTP/9 X: ?)."),
    (RuntimeError("one\ntwo"), "The attempt failed: RuntimeError (one two)."),
    (RuntimeError(), "The attempt failed: RuntimeError (RuntimeError)."),
])
def test_every_failure_is_said_in_a_few_words_on_one_line(failure, text):
    assert failures.described(failure) == text


def test_a_long_failure_is_cut_to_the_column():
    text = failures.described(http.client.HTTPException("x" * 1000))
    assert len(text) == failures.MAX_LENGTH == WebhookAttempt.error.max_length
