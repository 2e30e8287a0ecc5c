"""What a worker says while it admits keyed requests the limit storage could not count
(RATE_LIMIT_ON_STORAGE_FAILURE=open): each one in ratelimit_storage_failopen_total, and one WARNING
a minute with how many, rather than a log line per request while the storage is down."""

import logging
import time

from ops import metrics

log = logging.getLogger("ratelimit")

WARNING_INTERVAL = 60.0


class StorageOutage:
    """The requests admitted uncounted since the last WARNING; the first of an outage is told at once."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.admitted_since_warning = 0
        self.warned_at = None

    def admitted(self, error):
        """Count one keyed request admitted without its windows because of error (a StorageError)."""
        metrics.storage_failopen()
        self.admitted_since_warning += 1
        now = self.clock()
        if self.warned_at is None or now - self.warned_at >= WARNING_INTERVAL:
            log.warning("Rate-limit storage unavailable (%s): admitted %d keyed requests without counting them "
                        "since the last warning (RATE_LIMIT_ON_STORAGE_FAILURE=open).",
                        error, self.admitted_since_warning)
            self.admitted_since_warning = 0
            self.warned_at = now
