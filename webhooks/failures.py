"""What a failed attempt records: every way a receiver can end an attempt without an answer, or
with one that cannot be read, said in a few words on one line (the Security tab, `webhooks test`)."""

import http.client
import ssl

from webhooks import addresses

MAX_LENGTH = 200
# The most specific first: RemoteDisconnected is both a ConnectionResetError and a BadStatusLine.
TEXTS = [
    (http.client.RemoteDisconnected, "Connection closed without an answer."),
    (http.client.LineTooLong, "The answer's head has a line too long."),
    (http.client.BadStatusLine, "The answer is not HTTP: its status line cannot be read."),
    (http.client.IncompleteRead, "The answer was cut short."),
    (ConnectionRefusedError, "Connection refused."),
    (ConnectionResetError, "Connection reset."),
    (ConnectionAbortedError, "Connection aborted."),
    (BrokenPipeError, "Connection closed while the request was sent."),
    (UnicodeError, "The host name cannot be encoded."),
]


def described(failure):
    """A failed attempt's cause, from the exception it ended in: one line of at most MAX_LENGTH
    characters, whatever the receiver sent."""
    text = next((text for kind, text in TEXTS if isinstance(failure, kind)), None)
    if text is not None:
        return text
    # ssl's own errors carry OpenSSL's reason (WRONG_VERSION_NUMBER, say) and verify_message.
    if isinstance(failure, ssl.SSLCertVerificationError):
        text = f"TLS certificate not accepted: {getattr(failure, 'verify_message', None) or detail(failure)}."
    elif isinstance(failure, ssl.SSLError):
        reason = getattr(failure, "reason", None)
        text = f"TLS failed: {reason.replace('_', ' ').lower() if reason else detail(failure)}."
    elif isinstance(failure, addresses.RefusedAddress):
        text = str(failure)
    elif isinstance(failure, OSError):
        text = f"Network error: {failure.strerror or detail(failure)}."
    elif isinstance(failure, http.client.HTTPException):
        text = f"The answer is not valid HTTP/1.1 ({detail(failure)})."
    else:
        text = f"The attempt failed: {type(failure).__name__} ({detail(failure)})."
    return one_line(text)[:MAX_LENGTH]


def detail(failure):
    return str(failure) or type(failure).__name__


def one_line(text):
    """text with its runs of white space made one space and what cannot be printed made ?."""
    return "".join(character if character.isprintable() else "?" for character in " ".join(text.split()))
