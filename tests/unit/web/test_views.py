"""The web application with Flask's test client: every form, access rule, the secret shown once,
revocation, other users' keys, the hourly chart and how errors render (CSRF: test_csrf.py)."""

import datetime
import re
import types

import pytest
from limits import RateLimitItemPerMinute
from webforms import create_key, page

from accounts import throttles, users
from models import ApiKey, UsageHour, User, start_of_hour, utcnow
from orgs import keyactions
from web import signin

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
def test_landing_page_links_everything(client):
    response = client.get("/")
    assert response.status_code == 200
    for link in ('href="/signup"', 'href="/login"', 'href="/playground"', 'id="api"', "/api/v1/protected/test",
                 "X-API-Key", "/api/v1/ws/time?api_key=KEY"):
        assert link in page(response)


def test_signup_logs_in_and_hashes_the_password(client):
    response = client.post("/signup", data={"username": "bob", "email": "Bob@Example.com", "password": "s3cret pass"})
    assert response.status_code == 302
    # Sign-up lands on Security, whose one step is the first key.
    assert response.headers["Location"] == "/settings/security"
    security = page(client.get("/settings/security"))
    assert "Create the first key of bob" in security and "Log out bob" in security
    assert "bob@example.com" in page(client.get("/settings/profile"))
    user = User.get(User.username == "bob")
    assert user.password_hash.startswith("scrypt:1024:8:1$") and "s3cret pass" not in user.password_hash


@pytest.mark.parametrize("username, email, password, message", [
    ("b", "b@example.com", "long enough", "3 to 32 letters"),
    ("bob", "not-an-email", "long enough", "does not look like an email"),
    ("bob", "b@example.com", "short", "at least 8 characters"),
])
def test_signup_rejects_bad_input(client, username, email, password, message):
    response = client.post("/signup", data={"username": username, "email": email, "password": password})
    assert response.status_code == 400
    assert message in page(response)
    assert User.select().count() == 0


@pytest.mark.parametrize("username, email", [("alice", "new@example.com"), ("newbie", "alice@example.com")])
def test_signup_does_not_say_which_of_username_or_email_is_taken(client, user, username, email):
    response = client.post("/signup", data={"username": username, "email": email, "password": "long enough"})
    assert response.status_code == 400
    assert "That username or email cannot be used." in page(response)
    assert "taken" not in page(response) and "belongs" not in page(response)


def test_login_and_logout(client, user):
    response = client.post("/login", data={"username": "alice", "password": "correct horse battery"})
    assert response.status_code == 302
    assert response.headers["Location"] == "/settings/profile"
    assert client.get("/settings/security").status_code == 200
    assert client.post("/logout").headers["Location"] == "/"
    assert client.get("/settings/security").status_code == 302
    assert client.get("/logout").status_code == 405


@pytest.mark.parametrize("target, expected", [
    ("/playground", "/playground"),
    ("//evil.example/x", "/settings/profile"),
    ("/\\evil.example", "/settings/profile"),
    ("https://evil.example/", "/settings/profile"),
])
def test_login_returns_only_to_local_paths(client, user, target, expected):
    response = client.post("/login", query_string={"next": target},
                           data={"username": "alice", "password": "correct horse battery"})
    assert response.headers["Location"] == expected


def test_failed_logins_do_not_reveal_whether_the_user_exists(client, user):
    unknown = client.post("/login", data={"username": "mallory", "password": "correct horse battery"})
    wrong = client.post("/login", data={"username": "alice", "password": "wrong password"})
    assert unknown.status_code == wrong.status_code == 400
    message = "The username or password is incorrect."
    assert message in page(unknown) and message in page(wrong)
    assert page(unknown).replace("mallory", "alice") == page(wrong)


def test_failed_logins_are_limited_per_username_and_ip_without_locking_the_owner_out(client, user):
    for _ in range(throttles.LOGIN_FAILURES_PER_USERNAME_AND_IP.amount):
        client.post("/login", data={"username": "alice", "password": "wrong password"})
    response = client.post("/login", data={"username": "Alice", "password": "correct horse battery"})
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) > 0
    assert "Too many attempts" in page(response)
    assert "X-RateLimit-Limit" not in response.headers
    assert client.get("/settings/profile").status_code == 302
    owner = client.post("/login", data={"username": "alice", "password": "correct horse battery"},
                        environ_base={"REMOTE_ADDR": "10.0.0.9"})
    assert owner.status_code == 302


def test_failed_logins_are_limited_per_ip(client, user, monkeypatch):
    monkeypatch.setattr(throttles, "LOGIN_FAILURES_PER_IP", RateLimitItemPerMinute(3))
    for name in ("a1", "a2", "a3"):
        assert client.post("/login", data={"username": name, "password": "x"}).status_code == 400
    response = client.post("/login", data={"username": "alice", "password": "correct horse battery"})
    assert response.status_code == 429
    other_ip = client.post("/login", data={"username": "alice", "password": "correct horse battery"},
                           environ_base={"REMOTE_ADDR": "10.0.0.9"})
    assert other_ip.status_code == 302


def test_successful_logins_are_not_limited(client, user, monkeypatch):
    monkeypatch.setattr(throttles, "LOGIN_FAILURES_PER_IP", RateLimitItemPerMinute(2))
    for _ in range(5):
        response = client.post("/login", data={"username": "alice", "password": "correct horse battery"})
        assert response.status_code == 302


def test_many_failures_for_a_username_slow_its_logins_down_but_never_refuse_them(client, user, monkeypatch):
    monkeypatch.setattr(throttles, "LOGIN_SLOWDOWN_AFTER", RateLimitItemPerMinute(3))
    waits = []
    # signin's own name for the time module: the standard module's sleep stays, for other threads.
    monkeypatch.setattr(signin, "time", types.SimpleNamespace(sleep=waits.append))
    for n in range(3):
        client.post("/login", data={"username": "alice", "password": "wrong"},
                    environ_base={"REMOTE_ADDR": f"10.1.0.{n}"})
    assert waits == [0, 0, 0]
    response = client.post("/login", data={"username": "alice", "password": "correct horse battery"},
                           environ_base={"REMOTE_ADDR": "10.2.0.1"})
    assert response.status_code == 302
    assert waits[-1] == throttles.LOGIN_SLOWDOWN_SECONDS > 0


@pytest.mark.parametrize("method, path", [
    ("get", "/settings"),
    ("get", "/settings/profile"),
    ("get", "/settings/security"),
    ("get", "/playground"),
    ("post", "/settings/security/keys"),
    ("post", "/settings/security/keys/1/revoke"),
])
def test_account_pages_need_a_login(client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 302
    assert response.headers["Location"] == f"/login?next={path}"


def test_session_cookie_is_httponly_lax_and_secure_over_https(client, user):
    plain = client.post("/login", data={"username": "alice", "password": "correct horse battery"})
    cookie = plain.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    secure = client.post("/login", base_url="https://localhost",
                         data={"username": "alice", "password": "correct horse battery"})
    assert "Secure" in secure.headers["Set-Cookie"]


def test_new_key_secret_is_shown_once_and_works(app, logged_in):
    secret = create_key(logged_in, "Deploy bot", "production")
    assert secret.startswith("sk_live_")
    reloaded = page(logged_in.get("/settings/security"))
    assert secret not in reloaded and "new-secret" not in reloaded
    assert "Deploy bot" in reloaded and f"{secret[:12]}..." in reloaded
    response = logged_in.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    assert response.status_code == 200
    assert response.get_json()["api_key_name"] == "Deploy bot"
    assert not ApiKey.select().where(ApiKey.key_hash == secret).exists()


def test_the_secret_page_is_never_cached(logged_in):
    create_key(logged_in)
    response = logged_in.get("/settings/security")
    assert response.headers["Cache-Control"] == "no-store"
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]


@pytest.mark.parametrize("data, message", [
    ({"name": "  ", "type": "development"}, "A key name is 1 to 100 characters."),
    ({"name": "x" * 101, "type": "development"}, "A key name is 1 to 100 characters."),
    ({"name": "ok", "type": "staging"}, "The key type is either development or production."),
    ({"name": "ok"}, "The key type is either development or production."),
    ({"name": "ok", "type": "development", "credits": "-5"}, "Credits must be a whole number from 0"),
    ({"name": "ok", "type": "development", "credits": "1e3"}, "Credits must be a whole number from 0"),
    ({"name": "ok", "type": "development", "credits": "10", "refill": "10/week"}, "A refill is a whole number"),
])
def test_create_key_rejects_bad_input(logged_in, data, message):
    response = logged_in.post("/settings/security/keys", data=data)
    assert response.status_code == 400
    assert message in page(response)
    assert ApiKey.select().count() == 0


def test_the_create_form_gives_a_key_credits_and_a_refill_that_its_page_shows(logged_in):
    response = logged_in.post("/settings/security/keys", data={
        "name": "Metered", "type": "development", "credits": " 250 ", "refill": "1000/day"})
    assert response.status_code == 302
    key = ApiKey.get(ApiKey.name == "Metered")
    assert (key.credits_remaining, key.credits_refill_amount, key.credits_refill_interval) == (250, 1000, "day")
    html = re.sub(r"\s+", " ", page(logged_in.get(f"/settings/security/keys/{key.id}")))
    assert "250 left; set to 1000 every day, next at" in html
    logged_in.post("/settings/security/keys", data={"name": "Plain", "type": "development", "credits": ""})
    assert ApiKey.get(ApiKey.name == "Plain").credits_remaining is None
    assert 'id="credits"' not in page(logged_in.get(f"/settings/security/keys/{ApiKey.get(ApiKey.name == 'Plain').id}"))


def test_security_tab_lists_each_key_with_its_details(app, logged_in, api_key):
    for _ in range(2):
        logged_in.get("/api/v1/protected/test", headers={"X-API-Key": api_key})
    app.extensions["usage"].flush()
    create_key(logged_in, "Second", "production")
    keyactions.revoke_key(ApiKey.get(ApiKey.name == "Second"))
    html = page(logged_in.get("/settings/security"))
    dev = ApiKey.get(ApiKey.name == "Alice dev")
    row = html.split(f'id="key-{dev.id}"', 1)[1].split("</tr>", 1)[0]
    cells = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[:5] == ["Alice dev by alice from any address", "Development", f"{api_key[:12]}...",
                         dev.last_used_at.strftime("%Y-%m-%d %H:%M"), "Active"]
    assert "Revoke" in cells[5] and "Roll" in cells[5]
    assert f'href="/settings/security/keys/{dev.id}"' in row
    # Revoked keys wait, folded, below the active ones.
    active, revoked = html.split('<details class="revoked-keys">', 1)
    second_id = ApiKey.get(ApiKey.name == "Second").id
    assert f'id="key-{second_id}"' not in active and "<summary>Revoked (1)</summary>" in revoked
    second = revoked.split(f'id="key-{second_id}"', 1)[1].split("</tr>", 1)[0]
    assert "Second" in second and "Revoked" in second and "never" in second and "Yes, revoke" not in second


def test_security_tab_shows_the_accounts_totals(app, logged_in, api_key, pro_key):
    for secret in (api_key, api_key, pro_key, api_key, api_key):  # the free key's 4th is a 429
        logged_in.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    app.extensions["usage"].flush()
    html = page(logged_in.get("/settings/security"))
    totals = dict(re.findall(r"<dt>([^<]+)</dt><dd>(\d+)</dd>", html))
    assert totals == {"Last 24 hours": "5", "Last 30 days": "5", "Refused in 30 days": "1", "Counted, all time": "4"}


def test_the_form_preselects_90_days(logged_in):
    html = page(logged_in.get("/settings/security"))
    assert re.search(r'<option value="90d" selected>90 days</option>', html)
    assert '<option value="never">Never</option>' in html
    # A post without expires_in (a script, an old form) still makes a key that never expires.
    logged_in.post("/settings/security/keys", data={"name": "No expiry given", "type": "development"})
    assert ApiKey.get(ApiKey.name == "No expiry given").expires_at is None


def test_revoking_a_key_stops_it_on_the_very_next_request(logged_in):
    secret = create_key(logged_in)
    assert logged_in.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code == 200
    key = ApiKey.get(ApiKey.name == "Web key")
    response = logged_in.post(f"/settings/security/keys/{key.id}/revoke")
    assert response.headers["Location"] == "/settings/security"
    refused = logged_in.get("/api/v1/protected/test", headers={"X-API-Key": secret})
    assert refused.status_code == 401
    assert refused.get_json()["error"]["code"] == "invalid_api_key"
    assert "Revoked" in page(logged_in.get("/settings/security"))


def test_another_users_key_is_404(logged_in):
    bob = users.create_user("bob", "bob@example.com", "long enough")
    bobs_key, bobs_secret = keyactions.issue_key(bob, "Bob's key", "production")
    response = logged_in.post(f"/settings/security/keys/{bobs_key.id}/revoke", headers=HTML)
    assert response.status_code == 404
    assert response.content_type.startswith("text/html")
    assert logged_in.post("/settings/security/keys/999/revoke").status_code == 404
    assert ApiKey.get_by_id(bobs_key.id).revoked_at is None
    assert "Bob&#39;s key" not in page(logged_in.get("/settings/security"))
    assert logged_in.get("/api/v1/protected/test", headers={"X-API-Key": bobs_secret}).status_code == 200


def chart_rows(html, title):
    """The data table of the key page's chart with this title: [[period, total, by outcome...], ...]."""
    figure = html.split(f"<h4>{title}</h4>", 1)[1].split("</figure>", 1)[0]
    if "No requests yet." in figure:
        return None
    rows = re.findall(r'<tr><th scope="row">([^<]+)</th>(.*?)</tr>', figure, re.S)
    return [[label] + [int(cell) for cell in re.findall(r"<td>(\d+)</td>", cells)] for label, cells in rows]


def test_the_key_page_charts_flushed_counts_by_outcome_and_endpoint(app, logged_in, api_key):
    key = ApiKey.get(ApiKey.name == "Alice dev")
    now = start_of_hour(utcnow())
    UsageHour.create(api_key=key, hour=now - datetime.timedelta(hours=3), endpoint="/api/v1/user/me", requests=5)
    UsageHour.create(api_key=key, hour=now - datetime.timedelta(hours=24), endpoint="/api/v1/user/me", requests=7)
    html = page(logged_in.get(f"/settings/security/keys/{key.id}"))
    assert html.count("No requests yet.") == 4  # the daily rows are empty: only the flush writes them
    hours = chart_rows(html, "Requests per hour, last 24 hours")
    assert len(hours) == 24 and hours[20] == [(now - datetime.timedelta(hours=3)).strftime("%H:00"), 5, 5, 0, 0, 0]
    for path in ("/api/v1/user/me", "/api/v1/user/me", "/api/v1/protected/test", "/api/v1/protected/test"):
        logged_in.get(path, headers={"X-API-Key": api_key})  # free: 3 a minute, so the last is a 429
    app.extensions["usage"].flush()
    html = page(logged_in.get(f"/settings/security/keys/{key.id}"))
    assert chart_rows(html, "Requests per hour, last 24 hours")[-1] == [now.strftime("%H:00"), 4, 3, 0, 1, 0]
    week = chart_rows(html, "Requests per day, last 7 days")
    assert len(week) == 7 and week[-1][1:] == [4, 3, 0, 1, 0] and sum(row[1] for row in week) == 4
    assert len(chart_rows(html, "Requests per day, last 30 days")) == 30
    endpoints = html.split("<h4>By endpoint, last 24 hours</h4>", 1)[1].split("</figure>", 1)[0]
    assert re.findall(r'<th scope="row">([^<]+)</th><td>(\d+)</td>', endpoints) == [
        ("/api/v1/user/me", "7"), ("/api/v1/protected/test", "2")]
    assert '<svg class="usage-chart"' in html and "<script" not in html


def test_the_key_page_belongs_to_its_owner_alone(app, logged_in, user):
    from accounts import users

    bob = users.create_user("bob", "bob@example.com", "another long password")
    bobs, _ = keyactions.issue_key(bob, "Bob's key", "development")
    assert logged_in.get(f"/settings/security/keys/{bobs.id}").status_code == 404
    assert logged_in.get("/settings/security/keys/999999").status_code == 404
    mine, _ = keyactions.issue_key(user, "Mine", "development")
    html = page(logged_in.get(f"/settings/security/keys/{mine.id}"))
    assert "<h2>Mine</h2>" in html and html.count("No requests yet.") == 6
    assert 'name="current" value="' + mine.display_prefix in html
    logged_in.post("/logout")
    assert logged_in.get(f"/settings/security/keys/{mine.id}").headers["Location"].startswith("/login")


def test_playground_lists_the_endpoints_and_key_names_but_no_secret(logged_in, api_key):
    html = page(logged_in.get("/playground"))
    for path in ("/api/v1/demo/year", "/api/v1/status", "/api/v1/protected/test", "/api/v1/user/me",
                 "/api/v1/usage/stats", "/api/v1/ws/time", "/api/v1/ws/echo", "Alice dev", api_key[:12]):
        assert path in html
    assert api_key not in html
    assert 'src="/static/playground.js"' in html
    assert logged_in.get("/static/playground.js").status_code == 200


def test_api_errors_stay_json_even_for_browsers(client):
    response = client.get("/api/v1/user/me", headers=HTML)
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "missing_api_key"


def test_web_errors_are_html_for_browsers_and_json_for_other_clients(logged_in):
    browser = logged_in.post("/settings/security/keys/999/revoke", headers=HTML)
    assert browser.content_type == "text/html; charset=utf-8"
    assert "404 Not Found" in page(browser) and "Log out alice" in page(browser)
    for headers in ({}, {"Accept": "*/*"}, {"Accept": "application/json"}):
        other = logged_in.post("/settings/security/keys/999/revoke", headers=headers)
        assert other.get_json() == {"error": {"code": "not_found", "message": other.get_json()["error"]["message"]}}


def test_a_login_cookie_grants_nothing_on_the_api(logged_in):
    assert logged_in.get("/api/v1/status").get_json()["authenticated"] is False
    response = logged_in.get("/api/v1/user/me")
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "missing_api_key"
    assert "Set-Cookie" not in response.headers
