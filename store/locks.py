"""Locks for sections that never wait (a few dict operations on the hot path): the OS thread's own
locks, even where gevent has patched `threading`.

gevent's locks are for sections that may yield to another greenlet; an uncontended one costs
5,000-9,000 instructions to take and give back, a real one a few hundred. Greenlets switch only
where code waits, so between them such a section needs no lock at all; between real threads (the
CLI, Flask's test client, gevent's thread pool) it needs a real one, which is what these are. A
section guarded by one must never wait: a greenlet would then block its whole thread."""

from gevent import monkey


def short_lock():
    return monkey.get_original("_thread", "allocate_lock")()


def short_rlock():
    return monkey.get_original("_thread", "RLock")()
