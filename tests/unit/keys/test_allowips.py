"""Per-key IP allow-lists with Flask's test client and the CLI runner, on SQLite and PostgreSQL:
parsing and normalising entries, the sentences that refuse bad ones, the guard on REST and the
time socket's handshake, refused requests left uncounted, the web form, the CLI and the log."""

import re

import pytest
from flask import current_app

import auth
from accounts import securitylog
from keys import allowips, keycache, keyformat
from models import ApiKey
from orgs import keyactions

UPGRADE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
ALLOWED, OTHER = "203.0.113.7", "198.51.100.1"


@pytest.mark.parametrize("text, stored", [
    ("203.0.113.7", "203.0.113.7/32"),
    ("2001:db8::1", "2001:db8::1/128"),
    ("2001:DB8:0:0::/64", "2001:db8::/64"),
    ("203.0.113.7,198.51.100.0/24", "203.0.113.7/32,198.51.100.0/24"),
    ("  203.0.113.7 ,\n\n198.51.100.0/24\r\n", "203.0.113.7/32,198.51.100.0/24"),
    ("10.1.2.3/8", "10.0.0.0/8"),
    ("192.0.2.0/255.255.255.0", "192.0.2.0/24"),
    ("::ffff:192.0.2.1", "192.0.2.1/32"),
    ("::ffff:192.0.2.0/120", "192.0.2.0/24"),
    ("10.0.0.1, 10.0.0.1/32, 10.0.0.1", "10.0.0.1/32"),
    ("", None),
    (None, None),
    (" ,\n ", None),
])
def test_entries_are_normalised(text, stored):
    assert allowips.parse(text) == stored


@pytest.mark.parametrize("text, message", [
    ("203.0.113", "The IP allow-list entry '203.0.113' is not an IP address or CIDR network (like 203.0.113.7, "
                  "198.51.100.0/24 or 2001:db8::/64)."),
    ("10.0.0.1, example.com", "The IP allow-list entry 'example.com' is not"),
    ("10.0.0.0/33", "The IP allow-list entry '10.0.0.0/33' is not"),
    ("fe80::1%eth0", "The IP allow-list entry 'fe80::1%eth0' is not"),
    ("a;b, 10.0.0.1, c", "The IP allow-list entries 'a;b', 'c' are not IP addresses or CIDR networks"),
    (",".join(f"x{n}" for n in range(7)), "The IP allow-list entries 'x0', 'x1', 'x2', 'x3', 'x4' and 2 more are not"),
    (",".join(f"10.0.{n // 256}.{n % 256}" for n in range(101)),
     "An IP allow-list has at most 100 entries, not 101; use wider networks."),
    ("1" * 6001, "An IP allow-list is at most 6000 characters."),
])
def test_malformed_entries_are_refused_with_a_sentence_naming_them(text, message):
    with pytest.raises(ValueError) as refused:
        allowips.parse(text)
    assert str(refused.value).startswith(message)


def test_a_hundred_entries_are_accepted_and_each_matches():
    addresses = [f"10.0.{n // 256}.{n % 256}" for n in range(0, 400, 4)]
    networks = allowips.networks(allowips.parse("\n".join(f"{address}/31" for address in addresses)))
    for address in addresses:
        assert allowips.permits(networks, address)
        assert allowips.permits(networks, address[:-1] + str(int(address[-1]) + 1))
    assert not allowips.permits(networks, "10.0.0.2")


@pytest.mark.parametrize("address, permitted", [
    ("203.0.113.9", True), ("::ffff:203.0.113.9", True), ("2001:db8:0:0:1234::5", True), ("192.0.2.1", True),
    ("203.0.114.1", False), ("2001:db8:0:1::1", False), ("::203.0.113.9", False), ("192.0.2.2", False),
    ("2001:dba::", False), ("not an address", False), ("", False), (None, False),
])
def test_a_client_address_is_matched_against_the_networks(address, permitted):
    networks = allowips.networks(allowips.parse("203.0.113.0/24, 2001:db8::/64, 192.0.2.1, 2001:db9::/32"))
    assert allowips.permits(networks, address) is permitted


def test_the_summary_names_the_first_networks():
    assert allowips.summary(None) == "any address"
    assert allowips.summary("10.0.0.0/8") == "10.0.0.0/8"
    assert allowips.summary("1.1.1.1/32,2.2.2.2/32,3.3.3.3/32,4.4.4.4/32,5.5.5.5/32") == (
        "1.1.1.1/32, 2.2.2.2/32, 3.3.3.3/32 and 2 more")


def get(client, path, secret, address):
    return client.get(path, headers={"X-API-Key": secret}, environ_base={"REMOTE_ADDR": address})


@pytest.mark.parametrize("path", ["/api/v1/protected/test", "/api/v1/user/me", "/api/v1/usage/stats"])
def test_a_key_used_from_another_address_gets_403_and_is_not_counted(app, client, user, path):
    key, secret = keyactions.issue_key(user, "Office", "production", "pro", allow_ips=f"{ALLOWED}\n2001:db8::/64")
    refused = get(client, path, secret, OTHER)
    assert refused.status_code == 403
    assert refused.json["error"] == {
        "code": "ip_not_allowed",
        "message": f"This API key may not be used from {OTHER}: its IP allow-list does not include it.",
    }
    assert "X-RateLimit-Remaining" not in refused.headers
    assert app.extensions["usage"].total(key.id) == 0
    assert get(client, path, secret, ALLOWED).status_code == 200
    assert get(client, path, secret, "2001:db8::77").status_code == 200
    assert get(client, path, secret, f"::ffff:{ALLOWED}").status_code == 200
    assert app.extensions["usage"].total(key.id) == 3
    stats = get(client, "/api/v1/usage/stats", secret, ALLOWED).json
    assert (stats["total_requests"], stats["requests_remaining"]) == (4, 100 - 4)  # tier pro: 100 a minute


def test_refusals_do_not_use_up_the_allowance(app, client, user):
    key, secret = keyactions.issue_key(user, "Office", "development", allow_ips=ALLOWED)  # tier free: 3 a minute
    for _ in range(10):
        assert get(client, "/api/v1/protected/test", secret, OTHER).status_code == 403
    response = get(client, "/api/v1/protected/test", secret, ALLOWED)
    assert response.status_code == 200 and response.headers["X-RateLimit-Remaining"] == "2"
    app.extensions["usage"].flush()
    assert ApiKey.get_by_id(key.id).total_requests == 1


def test_the_scope_is_checked_first_and_neither_refusal_is_counted(app, client, user):
    key, secret = keyactions.issue_key(user, "Narrow", "development", scopes=["user:read"], allow_ips=ALLOWED)
    assert get(client, "/api/v1/protected/test", secret, OTHER).json["error"]["code"] == "insufficient_scope"
    assert get(client, "/api/v1/user/me", secret, OTHER).json["error"]["code"] == "ip_not_allowed"
    assert app.extensions["usage"].total(key.id) == 0


def test_x_forwarded_for_is_not_believed_without_trusted_proxies(app, client, user):
    _, secret = keyactions.issue_key(user, "Office", "development", allow_ips=ALLOWED)
    forwarded = {"X-API-Key": secret, "X-Forwarded-For": ALLOWED}
    # Without TRUSTED_PROXIES, X-Forwarded-For is whatever the client wrote, and is ignored.
    response = client.get("/api/v1/protected/test", headers=forwarded, environ_base={"REMOTE_ADDR": OTHER})
    assert response.status_code == 403


def test_a_key_without_an_allow_list_works_from_anywhere(client, user):
    key, secret = keyactions.issue_key(user, "Anywhere", "development", allow_ips="  ")
    assert ApiKey.get_by_id(key.id).allow_ips is None
    assert current_app.extensions["keys"].find(keyformat.hash_key(secret))[0].allowed_networks is None
    for address in (ALLOWED, OTHER, "2001:db8::1"):
        assert get(client, "/api/v1/protected/test", secret, address).status_code == 200


def test_the_networks_are_parsed_once_per_cached_key(app, client, user, monkeypatch):
    _, secret = keyactions.issue_key(user, "Office", "production", "pro", allow_ips=f"{ALLOWED},2001:db8::/64")
    parsed, parse = [], allowips.networks
    monkeypatch.setattr(allowips, "networks", lambda stored: parsed.append(stored) or parse(stored))
    for _ in range(5):
        assert get(client, "/api/v1/protected/test", secret, ALLOWED).status_code == 200
        assert get(client, "/api/v1/protected/test", secret, OTHER).status_code == 403
    cached = isinstance(app.extensions["keys"], keycache.KeyCache)
    # PostgreSQL with limits in memory keeps no key, and reads it (and its allow-list) per request.
    assert parsed == [f"{ALLOWED}/32,2001:db8::/64"] * (1 if cached else 10)


def test_the_time_socket_handshake_is_refused_from_another_address(app, client, user):
    key, secret = keyactions.issue_key(user, "Clock", "development", allow_ips=ALLOWED)
    response = client.get(f"/api/v1/ws/time?api_key={secret}", headers=UPGRADE, environ_base={"REMOTE_ADDR": OTHER})
    assert response.status_code == 403
    assert response.json["error"]["code"] == "ip_not_allowed"
    assert app.extensions["usage"].pending == {}
    assert app.extensions["socket_slots"].open == {}


def test_the_cli_creates_a_key_with_an_allow_list_and_lists_it(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "Office", "--type", "production",
                                 "--allow-ips", "203.0.113.7,2001:db8::/64"])
    assert result.exit_code == 0, result.output
    key = auth.authenticate(result.output.strip().splitlines()[-1])
    assert key.allow_ips == "203.0.113.7/32,2001:db8::/64"
    runner.invoke(args=["keys", "create", "alice", "--name", "Anywhere", "--type", "production"])
    lines = [line.split("\t") for line in runner.invoke(args=["keys", "list", "alice"]).output.strip().splitlines()]
    every_scope = "test:read,user:read,usage:read,time:stream"
    assert [line[7:] for line in lines] == [[every_scope, "203.0.113.7/32,2001:db8::/64", "-"],
                                            [every_scope, "any", "-"]]


def test_the_cli_refuses_malformed_entries_with_a_sentence(runner, user):
    result = runner.invoke(args=["keys", "create", "alice", "--name", "Office", "--type", "production",
                                 "--allow-ips", "203.0.113.7,10.0.0.300"])
    assert result.exit_code == 1
    assert "The IP allow-list entry '10.0.0.300' is not an IP address or CIDR network" in result.stderr
    assert ApiKey.select().count() == 0


def test_the_web_form_takes_an_allow_list_and_the_tab_shows_it(logged_in):
    response = logged_in.post("/settings/security/keys", data={
        "name": "Office", "type": "production", "allow_ips": "203.0.113.7\r\n198.51.100.0/24, 2001:db8::/64\r\n"
                                                             "192.0.2.1"})
    assert response.status_code == 302
    key = ApiKey.get(ApiKey.name == "Office")
    assert key.allow_ips == "203.0.113.7/32,198.51.100.0/24,2001:db8::/64,192.0.2.1/32"
    html = logged_in.get("/settings/security").get_data(as_text=True)
    row = html.split(f'id="key-{key.id}"', 1)[1].split("</tr>", 1)[0]
    shown = re.search(r'<span class="allow-ips" title="([^"]*)">([^<]*)</span>', row)
    assert shown.groups() == ("203.0.113.7/32, 198.51.100.0/24, 2001:db8::/64, 192.0.2.1/32",
                              "from 203.0.113.7/32, 198.51.100.0/24, 2001:db8::/64 and 1 more")
    assert 'name="allow_ips"' in html


def test_the_web_form_refuses_malformed_entries_and_keeps_what_was_typed(logged_in):
    response = logged_in.post("/settings/security/keys", data={
        "name": "Office", "type": "production", "allow_ips": "203.0.113.7\nlocalhost"})
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert "The IP allow-list entry &#39;localhost&#39; is not an IP address or CIDR network" in html
    assert re.search(r'<textarea id="key-allow-ips"[^>]*>203.0.113.7\nlocalhost</textarea>', html)
    assert ApiKey.select().count() == 0


def test_the_security_log_records_the_allow_list(user):
    office, _ = keyactions.issue_key(user, "Office", "development", allow_ips="203.0.113.7, 2001:db8::/64")
    anywhere, _ = keyactions.issue_key(user, "Anywhere", "development")
    details = [event.detail for event in securitylog.recent(user.id) if event.event == "key.created"]
    assert details == [f"Anywhere (id {anywhere.id}, {anywhere.display_prefix}...; from any address)",
                       f"Office (id {office.id}, {office.display_prefix}...; from 203.0.113.7/32, 2001:db8::/64)"]


def test_whoever_holds_the_secret_can_still_revoke_it_from_anywhere(client, user):
    """A finder outside the list can kill a leaked key; status says only what the 403 says too."""
    _, secret = keyactions.issue_key(user, "Office", "production", allow_ips=ALLOWED)
    assert get(client, "/api/v1/status", secret, OTHER).json["authenticated"] is True
    revoked = client.post("/api/v1/keys/revoke", headers={"X-API-Key": secret}, environ_base={"REMOTE_ADDR": OTHER})
    assert revoked.status_code == 200 and revoked.json["revoked"] is True
    assert get(client, "/api/v1/protected/test", secret, ALLOWED).status_code == 401
