"""GitHub's secret-scanning reports on the real server (the Procfile's gunicorn), with GitHub's
keys served from loopback: a report of 1,000 entries (50 active keys, 50 revoked ones, 900 other
providers' tokens) labelled and acted on, on SQLite and on PostgreSQL (its time is
bench/leakreports.py's to measure, on a quiet machine), 1 MiB bodies taken (declared and chunked)
whatever MAX_BODY_BYTES says and one byte more refused, a replay that changes nothing, concurrent
reports that read the keys once, a keys server that never answers or drips its answer cut off with
a 503 while other requests go on, no token in the log, and a reported key's page and `keys list`
saying that GitHub reported it, where and when."""

import concurrent.futures
import datetime
import json
import re
import subprocess
import sys
import threading
import time

import pytest
import requests
import services
from githubscanning import PATH, Signer, report, serving_keys
from liveserver import ROOT, SECRET_PATTERN, Browser, cli, service_env, serving

MIB = 1024 * 1024
# This service's keys among a report's 1,000 entries: half revoked before it, half by it.
ISSUED = 100
SIGNER = Signer("e" * 64)
# Makes a user and N active keys in one process (a CLI command each would take a minute); prints the secrets.
MAKE_KEYS = """
import sys
from app import app
import auth
from orgs import keyactions
from accounts import users
from models import User, utcnow
with app.app_context():
    user = users.create_user("carol", "carol@example.com", "a long password")
    User.update(email_verified_at=utcnow()).where(User.id == user.id).execute()
    for n in range(int(sys.argv[1])):
        print(keyactions.issue_key(user, f"key {n}", "production")[1])
"""


def scanning_env(tmp_path, keys, database="sqlite", **extra):
    return service_env(tmp_path, database, GITHUB_SECRET_SCANNING="on", GITHUB_SECRET_SCANNING_KEYS_URL=keys.url,
                       MAX_BODY_BYTES="1024", MAX_KEYS_PER_USER="1000", **extra)


def make_keys(env, count):
    made = subprocess.run([sys.executable, "-c", MAKE_KEYS, str(count)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=170)
    assert made.returncode == 0, made.stderr
    return made.stdout.split()


def post(server, body, headers=None, **options):
    return requests.post(server.base + PATH, data=body, headers=headers or SIGNER.headers(body), timeout=60, **options)


@pytest.fixture(scope="module")
def keys():
    with serving_keys(SIGNER) as keys:
        yield keys


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def scanning(request, tmp_path_factory, keys):
    """(server, env, the secrets of ISSUED active keys) on each database; afterwards no secret in its log."""
    tmp_path = tmp_path_factory.mktemp("scanning")
    env = scanning_env(tmp_path, keys, request.param)
    secrets = make_keys(env, ISSUED)
    with serving(tmp_path, env) as server:
        yield server, env, secrets
    output = server.output()
    assert not [secret for secret in secrets if secret in output or secret[12:] in output]


def test_a_report_of_1000_entries_labels_each_token_and_revokes_the_active_keys_once(scanning):
    server, env, secrets = scanning
    for secret in secrets[ISSUED // 2:]:
        assert requests.post(server.base + "/api/v1/keys/revoke", headers={"X-API-Key": secret}, timeout=10).ok
    others = [f"sk_live_51{n:04d}" + "Ab3dE" * 20 for n in range(1000 - ISSUED)]  # Stripe's form, not ours
    body = report(*secrets, *others)
    response = post(server, body)
    assert response.status_code == 200, response.text
    labels = [entry["label"] for entry in response.json()]
    assert labels == ["true_positive"] * ISSUED + ["false_positive"] * len(others)
    [(revoked,)] = services.rows(env["DATABASE_URL"], "SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL")
    assert revoked == ISSUED
    assert requests.get(server.base + "/api/v1/status", headers={"X-API-Key": secrets[0]},
                        timeout=10).json()["authenticated"] is False
    # Sent again (a replay, or GitHub's retry): the same answer, and not one more event or mail.
    counts = "SELECT (SELECT count(*) FROM security_events), (SELECT count(*) FROM mail_messages)"
    before = services.rows(env["DATABASE_URL"], counts)
    again = post(server, body)
    assert again.json() == response.json() and services.rows(env["DATABASE_URL"], counts) == before


def test_a_key_github_reported_says_so_on_its_page_and_in_keys_list(scanning):
    """The newcomer's case: a key GitHub reported showed only "Revoked". Its page and `keys list`
    say that GitHub reported it, where it was found and when."""
    server, env, _ = scanning
    browser = Browser(server).signup()
    assert browser.create_key("Pushed by mistake").status_code == 302
    secret = SECRET_PATTERN.search(browser.get("/settings/security").text)[1]
    url = "https://github.com/octo/repo/blob/0123abc/settings.py"
    assert post(server, report(secret, url=url)).json()[0]["label"] == "true_positive"
    [listed] = cli(env, "keys", "list", browser.username).splitlines()
    fields = listed.split("\t")
    assert fields[5] == "revoked" and fields[-1].startswith(f"revoked: reported by GitHub at {url} on ")
    revoked_at = datetime.datetime.strptime(fields[-1].rsplit(" ", 1)[1], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) - revoked_at).total_seconds() < 300
    page = browser.get(f"/settings/security/keys/{fields[0]}")
    assert page.status_code == 200
    status = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page.text.split('<dd id="status">', 1)[1].split("</dd>", 1)[0]))
    assert status.strip() == f"Revoked: reported by GitHub at {url} on {revoked_at:%Y-%m-%d %H:%M} UTC"


@pytest.mark.parametrize("sending", ["declared", "chunked"])
def test_1_mib_is_taken_whatever_max_body_bytes_says_and_one_byte_more_is_a_413(scanning, sending):
    server, _, _ = scanning
    body = report("sk_live_" + "x" * 38, url="u" * (MIB - len(report("sk_live_" + "x" * 38, url=""))))
    assert len(body) == MIB
    larger = body[:-2] + b'u"}]'

    def sent(data):
        return chunks(data) if sending == "chunked" else data

    accepted = post(server, sent(body), SIGNER.headers(body))
    assert accepted.status_code == 200 and accepted.json()[0]["label"] == "false_positive"
    refused = post(server, sent(larger), SIGNER.headers(larger))
    assert refused.status_code == 413
    assert refused.json()["error"] == {"code": "payload_too_large",
                                       "message": f"The request body is larger than the {MIB} bytes "
                                                  "this service accepts."}
    # Elsewhere MAX_BODY_BYTES holds.
    assert requests.post(server.base + "/api/v1/keys/revoke", data=b"x" * 1025, timeout=10).status_code == 413


def chunks(data, size=65536):
    for start in range(0, len(data), size):
        yield data[start:start + size]


def test_concurrent_reports_with_an_unknown_identifier_read_the_keys_once(tmp_path):
    with serving_keys(SIGNER) as keys:
        release = threading.Event()

        def slowly(handler):
            release.wait(10)
            return 200, json.dumps(keys.document).encode()

        keys.answer = slowly
        env = scanning_env(tmp_path, keys)
        with serving(tmp_path, env) as server:
            body = report("sk_live_" + "x" * 38)
            forged = SIGNER.headers(body, identifier="f" * 64)
            with concurrent.futures.ThreadPoolExecutor(20) as pool:
                answers = [pool.submit(post, server, body, forged) for _ in range(20)]
                time.sleep(1)
                release.set()
                statuses = [answer.result().status_code for answer in answers]
            assert statuses == [401] * 20
            assert keys.read_count() == 1


@pytest.mark.parametrize("behaviour", ["silent", "dripping body, then close", "HTTP/1.0 dripping"])
def test_keys_that_never_come_are_cut_off_with_a_503_while_other_requests_go_on(tmp_path, behaviour):
    with serving_keys(SIGNER) as keys:
        keys.answer = {"silent": lambda handler: None, "dripping body, then close": keys.drip_body,
                       "HTTP/1.0 dripping": lambda handler: keys.drip_body(handler, "HTTP/1.0")}[behaviour]
        env = scanning_env(tmp_path, keys)
        with serving(tmp_path, env) as server:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                started = time.monotonic()
                pending = pool.submit(post, server, report("sk_live_" + "x" * 38))
                time.sleep(0.5)
                # The worker is not held by the read: a request meanwhile is answered at once.
                status = requests.get(server.base + "/api/v1/status", timeout=10)
                assert status.status_code == 200 and time.monotonic() - started < 4
                response = pending.result()
            seconds = time.monotonic() - started
            assert response.status_code == 503 and response.headers["Retry-After"] == "60"
            assert response.json()["error"]["code"] == "service_unavailable"
            assert 4 < seconds < 9, seconds
            assert "GitHub's secret-scanning keys could not be read from http://127.0.0.1:" in server.output()
