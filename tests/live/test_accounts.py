"""The web application's accounts against an attacker, on the real server in both run modes (the
Procfile's gunicorn, and `python app.py`'s fallback server) with SQLite and PostgreSQL: redirects,
sessions, the new secret, log-in throttling, key caps, input, passwords, file modes, the access log
and proxy headers. Each browser has its own client address (X-Forwarded-For behind
TRUSTED_PROXIES=1)."""

import base64
import concurrent.futures
import re
import sqlite3
import stat
import sys
import zlib

import psycopg
import pytest
import requests
import websocket
from liveserver import (
    PASSWORD,
    SECRET_PATTERN,
    Browser,
    Server,
    cli,
    free_port,
    run_cli,
    service_env,
    serving,
    start_server,
    usernames,
    without_gunicorn,
)
from serverfixtures import each_run_mode, env_on_each_database
from webforms import Fields

from settings import DEFAULT_PASSWORD_HASH_COST

env = env_on_each_database
server_mode = each_run_mode


@pytest.fixture(scope="module")
def server_settings():
    return {"TRUSTED_PROXIES": "1"}


def cookie_payload(value):
    """What anyone holding Flask's session cookie can read without SECRET_KEY."""
    compressed = value.startswith(".")
    data = value.lstrip(".").split(".")[0]
    raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    return (zlib.decompress(raw) if compressed else raw).decode()


@pytest.mark.parametrize("next_path", [
    "/%09/evil.example", "/%5Cevil.example", "/%5C/evil.example", "/\t/evil.example", "%2F%2Fevil.example",
    "https:evil.example", "https://evil.example/", "javascript:alert(1)", "/%0a/evil.example",
    "/%0d%0aSet-Cookie:%20x=1", "//evil.example", "/%2F/evil.example%0a",
])
def test_login_never_redirects_off_the_site(server, next_path):
    browser = Browser(server).signup()
    browser.post("/logout", form_page="/settings/profile")
    response = browser.login(browser.username, next_path=next_path)
    assert response.status_code == 302
    assert response.headers["Location"] == "/settings/profile"


def test_login_returns_to_a_local_path(server):
    browser = Browser(server).signup()
    browser.post("/logout", form_page="/settings/profile")
    response = browser.login(browser.username, next_path="/playground")
    assert response.headers["Location"] == "/playground"


def test_a_cookie_copied_before_logout_is_logged_out_with_it(server):
    browser = Browser(server).signup()
    stolen = browser.copy()
    assert stolen.logged_in()
    assert browser.post("/logout", form_page="/settings/profile").status_code == 302
    assert not stolen.logged_in()


def test_the_new_secret_is_never_in_a_cookie_and_shown_once(server):
    browser = Browser(server).signup()
    response = browser.create_key()
    assert response.status_code == 302
    replay = browser.copy()
    page = browser.get("/settings/security").text
    secret = SECRET_PATTERN.search(page)[1]
    for cookie in [*response.cookies, *browser.http.cookies]:
        assert secret not in cookie_payload(cookie.value)
        assert secret[8:] not in cookie.value
    assert SECRET_PATTERN.search(replay.get("/settings/security").text) is None
    assert SECRET_PATTERN.search(browser.get("/settings/security").text) is None


def test_a_deleted_accounts_cookie_opens_no_account_created_later(server):
    browser = Browser(server).signup()
    stolen = browser.copy()
    response = browser.post("/settings/profile/delete", {"password": PASSWORD}, form_page="/settings/profile")
    assert response.status_code == 302 and response.headers["Location"] == "/"
    Browser(server).signup()
    assert not stolen.logged_in()


def test_an_account_deleted_in_the_database_leaves_no_session_to_the_next_account(server, env):
    browser = Browser(server).signup()
    stolen = browser.copy()
    url = env["DATABASE_URL"]
    if url.startswith("sqlite"):
        # The sqlite3 shell's way: foreign keys are not enforced, so the session row stays behind.
        # The next account gets the same id in a database where this happened before the upgrade
        # to AUTOINCREMENT ids, which knows only the highest id left.
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            connection.execute("DELETE FROM api_keys")
            connection.execute("DELETE FROM users WHERE username = ?", (browser.username,))
            connection.execute(
                "UPDATE sqlite_sequence SET seq = (SELECT coalesce(max(id), 0) FROM users) WHERE name = 'users'")
    else:
        with psycopg.connect(url) as connection:
            connection.execute("DELETE FROM users WHERE username = %s", (browser.username,))
    Browser(server).signup()
    assert not stolen.logged_in()


def test_others_failures_never_lock_the_owner_out(server):
    owner = Browser(server).signup()
    owner.post("/logout", form_page="/settings/profile")
    for _ in range(12):
        attacker = Browser(server)
        assert attacker.login(owner.username, "not the password").status_code == 400
    same_address_attacker = Browser(server)
    for _ in range(5):
        same_address_attacker.login(owner.username, "not the password")
    assert same_address_attacker.login(owner.username, "still not it").status_code == 429
    assert Browser(server).login(owner.username).status_code == 302


def test_the_key_cap_holds_in_the_web_application_and_the_cli(server, env):
    browser = Browser(server).signup()
    for n in range(20):
        assert browser.create_key(f"key {n}").status_code == 302
    refused = browser.create_key("one too many")
    assert refused.status_code == 400
    assert "An organisation may hold 20 active keys; revoke one before creating another." in refused.text
    result = run_cli(env, "keys", "create", browser.username, "--name", "cli key", "--type", "development")
    assert result.returncode != 0
    assert "An organisation may hold 20 active keys" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("field", ["username", "email", "password"])
def test_nul_and_control_characters_in_signup_get_a_sentence(server, field):
    data = {"username": next(usernames), "email": "nul@example.com", "password": PASSWORD}
    data[field] = data[field][:3] + "\x00" + data[field][3:]
    response = Browser(server).post("/signup", data)
    assert response.status_code == 400
    assert "cannot contain control characters" in response.text


@pytest.mark.parametrize("username, password", [("us\x00er", PASSWORD), ("user", "pass\x00word"),
                                                ("us\ter", PASSWORD)])
def test_nul_in_login_gets_a_sentence(server, username, password):
    response = Browser(server).login(username, password)
    assert response.status_code == 400
    assert "cannot contain control characters" in response.text


def test_nul_in_a_key_name_and_a_new_password_gets_a_sentence(server):
    browser = Browser(server).signup()
    response = browser.create_key("bad\x00name")
    assert response.status_code == 400 and "cannot contain control characters" in response.text
    response = browser.post("/settings/profile/password", {"current_password": PASSWORD,
                                                           "new_password": "new\x00password 42"},
                              form_page="/settings/profile")
    assert response.status_code == 400 and "cannot contain control characters" in response.text


@pytest.mark.parametrize("args", [
    ("users", "create", "nul\x01user", "--email", "n@example.com", "--password-stdin"),
    ("users", "create", "nuluser", "--email", "n\x01@example.com", "--password-stdin"),
    ("keys", "list", "nul\x01user"),
])
def test_control_characters_in_cli_arguments_get_a_sentence(env, args):
    result = run_cli(env, *args, stdin=PASSWORD + "\n")
    assert result.returncode == 1
    assert "cannot contain control characters" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("password", ["12345678", "password", "Password1", " " * 8, "iloveyou"])
def test_common_passwords_are_refused(server, password):
    response = Browser(server).post("/signup", {"username": next(usernames), "email": "c@example.com",
                                                "password": password})
    assert response.status_code == 400
    assert "That password is one of the most common passwords" in response.text  # the refusal, not the hint


@pytest.mark.parametrize("password, sentence, words", [
    ("seven77", "A password needs at least 8 characters.", "8 to"),
    ("x" * 1025, "A password has at most 1024 characters.", "1,024 characters"),
    ("iloveyou", "one of the most common passwords", "not one of the most common passwords"),
    ("ILoveYou", "one of the most common passwords", "capital letters make no difference"),
    ("tab\there-password", "cannot contain control characters", "no control or invisible characters"),
])
def test_the_signup_hint_names_the_rule_behind_each_refusal(server, password, sentence, words):
    hint = Fields(Browser(server).get("/signup").text).description("password")
    assert words in hint
    response = Browser(server).post("/signup", {"username": next(usernames), "email": "c@example.com",
                                                "password": password})
    assert response.status_code == 400
    form = Fields(response.text)
    assert sentence in form.texts["field-error"] and form.focused() == ["password"] and form.invalid() == ["password"]
    assert form.description("password") == " ".join(form.texts["field-error"].split()) + " " + hint


def test_usernames_are_unique_without_regard_to_case(server):
    browser = Browser(server).signup()
    twin = Browser(server).post("/signup", {"username": browser.username.upper(), "email": "twin@example.com",
                                            "password": PASSWORD})
    assert twin.status_code == 400
    assert Browser(server).login(browser.username.upper()).status_code == 302


def test_sign_out_everywhere_and_a_password_change_end_other_sessions(server):
    browser = Browser(server).signup()
    laptop, phone = Browser(server), Browser(server)
    assert laptop.login(browser.username).status_code == 302 and phone.login(browser.username).status_code == 302
    new_password = "a much longer passphrase"
    response = browser.post("/settings/profile/password", {"current_password": PASSWORD, "new_password": new_password},
                            form_page="/settings/profile")
    assert response.status_code == 302
    assert browser.logged_in() and not laptop.logged_in() and not phone.logged_in()
    assert Browser(server).login(browser.username).status_code == 400
    assert phone.login(browser.username, new_password).status_code == 302
    response = browser.post("/settings/security/sessions/revoke", form_page="/settings/security")
    assert response.status_code == 302 and response.headers["Location"] == "/login"
    assert not browser.logged_in() and not phone.logged_in()


def test_deleting_an_account_revokes_its_keys_and_closes_their_sockets(server):
    browser = Browser(server).signup()
    browser.create_key()
    secret = SECRET_PATTERN.search(browser.get("/settings/security").text)[1]
    ws = websocket.create_connection(server.base.replace("http", "ws") + f"/api/v1/ws/time?api_key={secret}",
                                     timeout=15)
    ws.recv()
    wrong = browser.post("/settings/profile/delete", {"password": "not it"}, form_page="/settings/profile")
    assert wrong.status_code == 400 and browser.logged_in()
    browser.post("/settings/profile/delete", {"password": PASSWORD}, form_page="/settings/profile")
    refused = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=10)
    assert refused.status_code == 401
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            assert int.from_bytes(data[:2], "big") == 4401
            break
    assert Browser(server).login(browser.username).status_code == 400


def test_keys_in_socket_paths_never_reach_the_log(server, env):
    secret = cli(env, "keys", "create", Browser(server).signup().username, "--name", "log", "--type",
                 "production").strip().splitlines()[-1]
    for path in (f"/api/v1/ws/time;api_key={secret}", f"/api/v1/ws/time/{secret}", f"/api/v1/{secret}",
                 f"/{secret[:2]}%5F{secret[3:7]}%5F{secret[8:]}", f"/%2573k_live_{secret[8:]}",
                 f"/{secret.upper()}", f"/settings/security/keys/{secret}/revoke"):
        requests.get(server.base + path, timeout=10)
    requests.get(server.base + "/after-the-keys", timeout=10)
    output = server.wait_for_output("/after-the-keys")
    assert secret not in output and secret[8:] not in output


def test_the_database_files_are_the_owners_alone(tmp_path, run_mode):
    env = service_env(tmp_path)
    server = start_server(tmp_path, env, run_mode)
    try:
        Browser(server).signup()
        for name in ("server.db", "server.db-wal", "server.db-shm"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    finally:
        server.stop()


def test_forwarded_headers_are_trusted_only_behind_trusted_proxies(tmp_path, server):
    port = free_port()
    env = service_env(tmp_path, TRUSTED_PROXIES="0", PORT=str(port))
    if server.mode == "gunicorn":
        direct = Server([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "app:app"], env, port,
                        tmp_path / "direct.log")
    else:
        direct = Server([sys.executable, "app.py"], without_gunicorn(env), port, tmp_path / "direct.log", server.mode)
    try:
        response = requests.get(direct.base + "/login", headers={"X-Forwarded-Proto": "https"}, timeout=10)
        assert "Strict-Transport-Security" not in response.headers
        assert "secure" not in response.headers.get("Set-Cookie", "").lower()
    finally:
        direct.stop()
    proxied = requests.get(server.base + "/login", headers={"X-Forwarded-Proto": "https"}, timeout=10)
    assert proxied.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert "Secure" in proxied.headers["Set-Cookie"]


def test_no_query_string_gives_a_500(server):
    for query in ("next=%0a", "next=%00", "next=%ff%fe", "next=" + "%2F" * 5000):
        assert requests.get(server.base + "/login?" + query, timeout=10).status_code < 500


def test_parallel_wrong_passwords_from_one_address_cannot_pass_the_limit(server):
    owner = Browser(server).signup()
    attacker = Browser(server)
    token = re.search(r'name="csrf_token" value="([^"]+)"', attacker.get("/login").text)[1]

    def guess(n):
        return attacker.http.post(server.base + "/login", data={"username": owner.username, "password": f"guess {n}",
                                                               "csrf_token": token},
                                  allow_redirects=False, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        statuses = list(pool.map(guess, range(30)))
    assert statuses.count(400) <= 5 and statuses.count(429) >= 25, statuses


@pytest.fixture
def server_at_full_cost(env, tmp_path, run_mode):
    """A second server on the module's database, hashing at the service's own cost (the others hash
    at a test's cost, tests/conftest.py), which is what a flood of log-ins must not turn against
    the API."""
    with serving(tmp_path, dict(env, PASSWORD_HASH_COST=str(DEFAULT_PASSWORD_HASH_COST)), run_mode) as server:
        yield server


def test_a_flood_of_log_ins_never_takes_the_api_down(server_at_full_cost, env):
    server = server_at_full_cost
    secret = cli(env, "keys", "create", Browser(server).signup().username, "--name", "flood", "--type",
                 "production").strip().splitlines()[-1]
    pages = [Browser(server) for _ in range(120)]
    tokens = [re.search(r'name="csrf_token" value="([^"]+)"', page.get("/login").text)[1] for page in pages]
    for page in pages:
        # Each log-in on a new connection: a kept-alive one may reach the server's keep-alive
        # timeout just as its POST is sent, and a POST is not sent again.
        page.http.close()

    def log_in(n):
        return pages[n].http.post(server.base + "/login", data={"username": f"nobody{n}", "password": "a guess",
                                                               "csrf_token": tokens[n]},
                                  allow_redirects=False, timeout=60).status_code

    def api():
        return requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret},
                            timeout=10).status_code

    with concurrent.futures.ThreadPoolExecutor(130) as pool:
        logins = [pool.submit(log_in, n) for n in range(120)]
        calls = [pool.submit(api) for _ in range(10)]
        statuses = [login.result() for login in logins]
        assert [call.result() for call in calls] == [200] * 10
    assert set(statuses) <= {400, 503}, statuses


def test_a_copied_cookie_ends_with_a_password_change_or_the_next_log_in(server):
    browser = Browser(server).signup()
    stolen = browser.copy()
    response = browser.post("/settings/profile/password", {"current_password": PASSWORD,
                                                           "new_password": "another long passphrase"},
                            form_page="/settings/profile")
    assert response.status_code == 302
    assert browser.logged_in() and not stolen.logged_in()
    stolen = browser.copy()
    other = Browser(server).signup()
    assert browser.login(other.username).status_code == 302
    assert not stolen.logged_in()


def test_the_password_forms_are_throttled_like_log_in(server):
    browser = Browser(server).signup()
    for _ in range(5):
        wrong = browser.post("/settings/profile/delete", {"password": "a guess"}, form_page="/settings/profile")
        assert wrong.status_code == 400
    refused = browser.post("/settings/profile/delete", {"password": PASSWORD}, form_page="/settings/profile")
    assert refused.status_code == 429 and "Too many wrong passwords" in refused.text
    assert browser.logged_in()


def test_a_key_id_beyond_any_database_gets_404(server):
    browser = Browser(server).signup()
    response = browser.post(f"/settings/security/keys/{2**64}/revoke", form_page="/settings/security")
    assert response.status_code == 404
