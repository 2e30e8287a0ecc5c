"""The peer: what a user might write instead, FastAPI on uvicorn (uvloop, httptools), serving
protected/test with the service's per-request work in a plainer form. bench/servers.py starts it
as `uvicorn bench.peer:app`, with the secret the bench sends in PEER_KEY and its database's path
in PEER_DATABASE.

    GET /api/v1/protected/test        an `async def` route, run on the event loop
    GET /sync/api/v1/protected/test   a plain `def` route, run in the threadpool
"""

import asyncio
import contextlib
import datetime
import hashlib
import math
import os
import secrets
import sqlite3
import threading
from collections import Counter
from typing import Annotated

from fastapi import FastAPI, Header, Response
from fastapi.responses import JSONResponse
from limits import parse
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter

KEYS = 10_000
DATABASE = os.environ.get("PEER_DATABASE", "peer.db")
LIMIT = parse("1000000000/hour")  # generous: a bench never meets a 429
LOOKUP = "SELECT id, name, key_type, rate_limit_tier FROM api_keys WHERE key_hash = ?"

limiter = FixedWindowRateLimiter(MemoryStorage())
usage, usage_lock = Counter(), threading.Lock()
local = threading.local()


def hash_key(secret):
    return hashlib.sha256(secret.encode()).hexdigest()


def connection():
    """This thread's SQLite connection, opened on its first request and kept (a sqlite3
    connection belongs to the thread that opened it)."""
    if not hasattr(local, "connection"):
        local.connection = sqlite3.connect(DATABASE)
    return local.connection


def create_database():
    """A fresh database of KEYS keys, stored as their SHA-256, the one in PEER_KEY among them."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(DATABASE)
    db = sqlite3.connect(DATABASE)
    db.execute("PRAGMA journal_mode = wal")
    db.execute("CREATE TABLE api_keys (id INTEGER PRIMARY KEY, key_hash TEXT UNIQUE NOT NULL, name TEXT NOT NULL,"
               " key_type TEXT NOT NULL, rate_limit_tier TEXT NOT NULL)")
    db.execute("CREATE TABLE usage (api_key INTEGER NOT NULL, hour TEXT NOT NULL, requests INTEGER NOT NULL,"
               " PRIMARY KEY (api_key, hour))")
    keys = [os.environ["PEER_KEY"]] + [secrets.token_urlsafe(32) for _ in range(KEYS - 1)]
    with db:
        db.executemany("INSERT INTO api_keys (key_hash, name, key_type, rate_limit_tier) VALUES (?, ?, ?, ?)",
                       ((hash_key(key), f"bench {i}", "development", "free") for i, key in enumerate(keys)))
    db.close()


def flush_usage():
    """Add the counts since the last flush to the usage table, in one transaction."""
    with usage_lock:
        counts = usage.copy()
        usage.clear()
    hour = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:00:00Z")
    with connection() as db:
        db.executemany("INSERT INTO usage VALUES (?, ?, ?)"
                       " ON CONFLICT DO UPDATE SET requests = requests + excluded.requests",
                       ((key, hour, count) for key, count in counts.items()))


async def flush_every_second():
    while True:
        await asyncio.sleep(1)
        flush_usage()


@contextlib.asynccontextmanager
async def lifespan(app):
    create_database()
    flusher = asyncio.create_task(flush_every_second())
    yield
    flusher.cancel()
    flush_usage()


app = FastAPI(lifespan=lifespan)


def protected_test(secret, response):
    """The body of protected/test for this secret, its window in the response's headers; or a
    JSON 401 or 429."""
    row = connection().execute(LOOKUP, (hash_key(secret),)).fetchone() if secret else None
    if row is None:
        return JSONResponse({"error": {"code": "invalid_api_key", "message": "The API key is not valid."}}, 401)
    key_id, name, key_type, tier = row
    admitted = limiter.hit(LIMIT, str(key_id))
    reset, remaining = limiter.get_window_stats(LIMIT, str(key_id))
    headers = {"X-RateLimit-Limit": str(LIMIT.amount), "X-RateLimit-Remaining": str(remaining),
               "X-RateLimit-Reset": str(math.ceil(reset))}
    with usage_lock:
        usage[key_id] += 1
    if not admitted:
        return JSONResponse({"error": {"code": "rate_limit_exceeded", "message": "Too many requests."}}, 429, headers)
    response.headers.update(headers)
    return {
        "success": True,
        "message": "Your API key is valid.",
        "api_key_name": name,
        "api_key_type": key_type,
        "rate_limit_tier": tier,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


@app.get("/api/v1/protected/test")
async def protected_test_async(response: Response, x_api_key: Annotated[str | None, Header()] = None):
    return protected_test(x_api_key, response)


@app.get("/sync/api/v1/protected/test")
def protected_test_sync(response: Response, x_api_key: Annotated[str | None, Header()] = None):
    return protected_test(x_api_key, response)
