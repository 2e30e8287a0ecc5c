"""A steady keyed load on one or more instances, and the keys it uses, made in one process: the
scale-out tests' and the billing export's."""

import collections
import random
import subprocess
import sys
import threading
import time

import requests
from liveserver import ROOT

TIMEOUT = 5

MAKE_KEYS = """
import auth
from orgs import keyactions
from app import app
from accounts import users
with app.app_context():
    user = users.create_user("carol", "carol@example.com", "a long password 42")
    for index in range({count}):
        credits = {credits} if index % 2 else None
        print(keyactions.issue_key(user, f"key {{index}}", "production", credits_given=credits)[1])
"""


def make_keys(env, count, credits=None):
    """Make count keys of carol's (made with them); with credits, every other key has that many."""
    made = subprocess.run([sys.executable, "-c", MAKE_KEYS.format(count=count, credits=credits)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return made.stdout.split()


Call = collections.namedtuple("Call", "started instance key outcome code duration")


class Load:
    """Client threads calling protected/test on both instances with the keys in turn, back to back."""

    def __init__(self, servers, keys, threads=6):
        self.servers, self.keys = servers, keys
        self.calls = []
        self.running = True
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(threads)]
        for thread in self.threads:
            thread.start()

    def run(self, offset):
        sessions = [requests.Session() for _ in self.servers]
        # Every process serves every key, in an order of its own, as behind a load balancer.
        pick = random.Random(offset)
        while self.running:
            instance, key = pick.randrange(len(self.servers)), pick.choice(self.keys)
            started = time.monotonic()
            code = None
            try:
                response = sessions[instance].get(self.servers[instance].base + "/api/v1/protected/test",
                                                  headers={"X-API-Key": key}, timeout=TIMEOUT)
                outcome = response.status_code
                if outcome != 200:
                    code = response.json()["error"]["code"]
            except requests.RequestException as error:
                outcome, sessions[instance] = type(error).__name__, requests.Session()
            self.calls.append(Call(started, instance, key, outcome, code, time.monotonic() - started))
            # About 40 requests a second a thread: a steady load, not a saturating one.
            time.sleep(0.02)

    def stop(self):
        self.running = False
        for thread in self.threads:
            thread.join()
        return self.calls

    def between(self, start, end):
        return [call for call in self.calls if start <= call.started <= end]
