"""A serving process made ready before it serves: the libraries requests import on first use
imported, then everything loaded frozen out of the garbage collector's way; and in a gunicorn worker,
which may be taking over from one a reload retires, its first database and Redis connections open."""

import gc
import importlib

from ws import freezer

# What a request imports on first use, not at start (so a CLI command never does): py_webauthn
# for a passkey ceremony, Fernet for a kept or sealed secret, segno for a set-up's QR code, the
# email package and smtplib for a mail. Imported after the freeze, their objects would add to
# every full collection.
FIRST_USE_LIBRARIES = ("webauthn", "cryptography.fernet", "segno", "email.headerregistry", "email.message",
                       "smtplib")


def freeze_heap():
    """Import FIRST_USE_LIBRARIES, then freeze every object alive: what a serving process holds by
    now (modules, the app) lives as long as it, and full collections would otherwise walk it every
    time and pause every connection."""
    for name in FIRST_USE_LIBRARIES:
        importlib.import_module(name)
    gc.freeze()
    # And, once time sockets tick, the WebSockets' objects as they open (ws/freezer.py).
    freezer.FREEZER.enable()


def open_connections(app):
    """Open the process's first database and limit-storage connections through the readiness checks
    (each bounded in time, a failure logged and left to the requests). After a reload a new worker
    takes over from an old one as soon as it serves: its first requests would otherwise each open
    their own, and on a loaded machine take many times a warm request's time."""
    app.extensions["readiness"].checks()
