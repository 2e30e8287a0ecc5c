"""What a worker knows and says while the limit storage fails: its failures as an ERROR line every
few seconds at most (FailureLog); and while it admits keyed requests the storage could not count
(RATE_LIMIT_ON_STORAGE_FAILURE=open), each one in ratelimit_storage_failopen_total, and one WARNING
a minute with how many, rather than a log line per request while the storage is down; and, for a
second after a failure, that the storage is not worth asking (each ask of a hung Redis waits for
its timeout)."""

import logging
import time

from ops import metrics

log = logging.getLogger("ratelimit")

WARNING_INTERVAL = 60.0
# How long after a failure requests are admitted without asking the storage again.
RETRY_INTERVAL = 1.0


class StorageOutage:
    """The requests admitted uncounted since the last WARNING, which comes with the first of them
    and then at most once a minute; and the storage's last failure."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.admitted_since_warning = 0
        self.warned_at = None
        self.failed_at = None
        self.error = None

    def failed(self, error):
        """The storage failed just now with error (what the StorageError said)."""
        self.failed_at, self.error = self.clock(), error

    def recent(self):
        """True while the storage is not worth asking: for RETRY_INTERVAL after its last failure. The
        first caller after that asks it again for all, and the others go on not asking until it
        has an answer (answered), or for another interval (a hung Redis holds each asker for its
        timeout: one a second, not every request of that second)."""
        if self.failed_at is None:
            return False
        now = self.clock()
        if now - self.failed_at < RETRY_INTERVAL:
            return True
        self.failed_at = now
        return False

    def answered(self):
        """The storage answered: every request asks it again."""
        self.failed_at = None

    def admitted(self):
        """Count one keyed request admitted without its windows."""
        metrics.storage_failopen()
        self.admitted_since_warning += 1
        now = self.clock()
        if self.warned_at is None or now - self.warned_at >= WARNING_INTERVAL:
            # Taken and reset before the log call, which may yield to another greenlet.
            count, self.admitted_since_warning, self.warned_at = self.admitted_since_warning, 0, now
            log.warning("Rate-limit storage unavailable (%s): admitted %d keyed requests without counting them "
                        "since the last warning (RATE_LIMIT_ON_STORAGE_FAILURE=open).", self.error, count)


class FailureLog:
    """The limit storage's failures as ERROR lines: the first at once, then at most one every
    INTERVAL seconds with how many it left out, so that an outage under a flood of requests, each
    refused (or admitted) alike, does not flood the log. A failure after QUIET seconds without one
    starts a new outage, logged at once."""

    INTERVAL = 10.0
    QUIET = 2.0

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.logged_at = None
        self.failed_at = None
        self.left_out = 0

    def failed(self, error):
        now = self.clock()
        last, self.failed_at = self.failed_at, now
        if self.logged_at is not None and now - self.logged_at < self.INTERVAL and now - last < self.QUIET:
            self.left_out += 1
            return
        # Taken and reset before the log call, which may yield to another greenlet.
        left_out, self.left_out, self.logged_at = self.left_out, 0, now
        log.error("Rate-limit storage unavailable: %s%s", error,
                  f" ({left_out} more failures since the last line)" if left_out else "")
