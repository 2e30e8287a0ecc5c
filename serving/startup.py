"""What happens before the app is imported: `.env` read into the environment, and for `python app.py`
the choice of server (gunicorn where it runs, else gevent's WSGI server in this process, patched
first), the port check, and the start-up warnings."""

# app.py imports this module before gevent patches the standard library: at import it must make
# nothing that gevent patches (no thread, lock or socket).
import errno
import os
import re
import signal
import socket
import sys
from pathlib import Path

import settings

# Why gunicorn cannot run here (the ImportError's words), or None where it can; set by prepare().
gunicorn_unavailable = None

SECRET_KEY_COMMAND = "python -c \"import secrets; print(secrets.token_hex())\""
MIN_SECRET_KEY_LENGTH = 32
MIN_SECRET_KEY_CHARACTERS = 8
# Keys from tutorials, templates and .env examples, in lower case without separators; a key that
# holds one of the phrases (django-insecure-..., your-secret-key-change-me-...) is one too.
PLACEHOLDER_SECRET_KEYS = {
    "changeme", "change", "changeit", "secret", "secretkey", "mysecret", "mysecretkey", "yoursecretkey",
    "supersecret", "supersecretkey", "topsecret", "dev", "devkey", "devsecret", "development", "test",
    "testing", "testsecret", "default", "password", "key", "flask", "django", "abc123"}
PLACEHOLDER_PHRASES = ("changeme", "changethis", "changeinproduction", "replaceme", "replacethis", "yoursecret",
                       "insecure", "notsecret", "notasecret", "placeholder", "example", "secretkeyhere", "donotuse")


def read_env_file():
    """Add the variables of `.env` in the working directory to the environment; a variable already
    set in the real environment wins. FLASK_SKIP_DOTENV=1 (as for the flask command) or
    PYTHON_DOTENV_DISABLED=1 (python-dotenv's own switch) turns this off."""
    if (os.environ.get("FLASK_SKIP_DOTENV") or "0").lower() not in ("0", "false", "no"):
        return
    from dotenv import load_dotenv

    load_dotenv(Path.cwd() / ".env", override=False, encoding="utf-8")


def prepare():
    """Run first thing in `python app.py`: decide the server, read .env, and where gunicorn cannot
    run, patch the standard library for gevent before the app and its modules are imported (as
    gunicorn's gevent worker does before it imports the app; models.py and accounts/users.py rely on it)."""
    global gunicorn_unavailable
    # gunicorn reads WEB_CONCURRENCY as it is imported, below, and fails on a bad one with a traceback.
    try:
        settings.workers(os.environ)
    except settings.ConfigError as error:
        settings.exit_with(error)
    gunicorn_unavailable = gunicorn_problem()
    if gunicorn_unavailable is None:
        read_env_file()
        return
    from serving import patching

    patching.patch_all()
    read_env_file()
    # gunicorn.conf.py's folder for summing the workers' metrics: one process needs none, and would
    # otherwise add the counts an earlier run left there.
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)


def gunicorn_problem():
    """None where gunicorn and its gevent worker can be imported, else why not (on Windows, gunicorn
    imports fcntl)."""
    try:
        import gunicorn.app.wsgiapp  # noqa: F401  what `python -m gunicorn` runs
        import gunicorn.workers.ggevent  # noqa: F401  what serving/worker.py, the worker gunicorn.conf.py names, builds on
    except ImportError as error:
        return str(error)
    return None


def refuse_busy_port(host, port):
    """Exit at once with a sentence when HOST:PORT cannot be listened on; for a port taken by
    another program (on macOS the AirPlay Receiver holds 5000), the line to try instead. gunicorn
    would retry for 5 s and then say only "Can't connect"."""
    try:
        listen_once(host, port)
    except OSError as error:
        raise SystemExit(cannot_listen(host, port, error)) from None


def listen_once(host, port):
    """Bind host:port as the servers will, and let go at once; raise OSError if that fails."""
    family, _, _, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # gunicorn and gevent listen with SO_REUSEADDR, except on Windows, where it would let two
        # programs share a port; without it, connections in TIME_WAIT would refuse the check.
        if os.name != "nt":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)


def cannot_listen(host, port, error):
    """The sentence for an address that cannot be listened on; for a busy port, with the command
    that starts the service on a free one."""
    # Windows refuses a port another program holds exclusively with WSAEACCES.
    if error.errno != errno.EADDRINUSE and getattr(error, "winerror", None) != 10013:
        return (f"Cannot listen on {host}:{port} ({error.strerror or error}): check HOST (an address of this "
                f"machine, 127.0.0.1 by default) and PORT.")
    problem = f"Port {port} on {host} is already in use by another program"
    if port == 5000 and sys.platform == "darwin":
        problem += " (on macOS, the AirPlay Receiver listens on 5000)"
    other = next_free_port(host, port)
    if os.name == "nt":
        command = f"    set PORT={other}\n    python app.py\n\n(in PowerShell: $env:PORT={other}; python app.py; "
    else:
        command = f"    PORT={other} python app.py\n\n("
    return f"{problem}. Start the service on another port:\n\n{command}or put PORT={other} in .env)"


def next_free_port(host, port, tries=50):
    """The first port after port that can be listened on now (port + 1 when none of them can)."""
    for candidate in range(port + 1, min(port + 1 + tries, 65536)):
        try:
            listen_once(host, candidate)
            return candidate
        except OSError:
            continue
    return port + 1


def secret_key_warning(environ, workers):
    """A sentence when SECRET_KEY is set but weak (weak_secret_key), or when it is not set (so it is
    generated and kept in this machine's instance/) while the service looks deployed: behind a
    proxy (TRUSTED_PROXIES) or in several workers (the count the server really starts); else None."""
    secret = environ.get("SECRET_KEY")
    if secret:
        problem = weak_secret_key(secret)
        if problem is None:
            return None
        return (f"SECRET_KEY {problem}: whoever guesses it can forge a session for any account, and with a copy "
                f"of the database read the two-factor secrets it seals. Set a random one of at least "
                f"{MIN_SECRET_KEY_LENGTH} characters ({SECRET_KEY_COMMAND} makes one); the change ends every "
                f"session and each account's authenticator codes until its owner sets two-factor log-in up "
                f"again (docs/deploying.md).")
    proxies = (environ.get("TRUSTED_PROXIES") or "0").strip()
    if proxies not in ("", "0"):
        looks = f"TRUSTED_PROXIES={proxies}"
    elif workers > 1:
        looks = f"{workers} workers"
    else:
        return None
    return (f"SECRET_KEY is not set, so the session secret is generated and kept in instance/ on this "
            f"machine, while the service looks deployed ({looks}). Every instance needs the same SECRET_KEY: "
            f"without it, sessions fail on the other instances and end at every redeploy. Set SECRET_KEY in "
            f"the environment ({SECRET_KEY_COMMAND} makes one).")


def weak_secret_key(secret):
    """What makes a SECRET_KEY easy to guess (a clause), or None."""
    plain = re.sub(r"[^a-z0-9]", "", secret.lower())
    if plain in PLACEHOLDER_SECRET_KEYS or any(phrase in plain for phrase in PLACEHOLDER_PHRASES):
        return "is a well-known placeholder"
    if len(secret) < MIN_SECRET_KEY_LENGTH:
        return f"is only {len(secret)} characters long"
    if len(set(secret)) < MIN_SECRET_KEY_CHARACTERS:
        return f"is made of fewer than {MIN_SECRET_KEY_CHARACTERS} different characters"
    return None


def ignore_stop_signals():
    """Once the process has stopped, ignore a stop signal. While the interpreter ends, CPython puts
    each signal with a Python handler back to its default, so a platform that signals the process
    and then its group would end a clean stop with status -SIGTERM."""
    for name in ("SIGINT", "SIGTERM", "SIGQUIT", "SIGBREAK"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
