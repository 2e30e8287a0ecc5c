"""A key's page beyond its charts (those are test_views.py's): a key of another of the user's
organisations names that organisation and offers the switch that comes back to it, a stranger's key
is the same 404 as no key, in the service's own words; a key revoked as leaked says who reported it,
where and when."""

import re

from webforms import page

import auth
from models import ApiKey
from orgs import keyactions

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
GITHUB_URL = "https://github.com/acme/app/blob/main/.env"


def text(response):
    """The page's text with its tags dropped and its white space made single spaces."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page(response))).strip()


def test_a_key_of_another_of_the_users_organisations_names_it_and_offers_the_switch(team, log_in):
    olive = log_in("olive", org=None)  # Acme's owner, working in her personal organisation
    path = f"/settings/security/keys/{team.keys['tess'].id}"
    response = olive.get(path, headers=HTML)
    assert response.status_code == 200
    html = page(response)
    assert "This key belongs to the organisation Acme, and you work in olive now." in text(response)
    assert "tess&#39;s key: a key of Acme" in html
    offer = html.split('<form method="post" action="/orgs/switch">', 1)[1].split("</form>", 1)[0]
    assert 'name="csrf_token" value="' in offer
    assert '<input type="hidden" name="org" value="acme">' in offer
    assert f'<input type="hidden" name="next" value="{path}">' in offer
    assert "Switch to Acme</button>" in offer
    # Nothing of the key but its name until the switch: not its prefix, nor a form to act on it.
    assert team.keys["tess"].display_prefix not in html and "/roll" not in html and "/revoke" not in html

    switched = olive.post("/orgs/switch", data={"org": "acme", "next": path})
    assert switched.status_code == 302 and switched.location == path
    key_page = olive.get(path)
    assert "<h2>tess&#39;s key</h2>" in page(key_page) and team.keys["tess"].display_prefix in page(key_page)


def test_the_switch_comes_back_only_to_a_key_page_of_the_organisation_switched_to(team, log_in):
    olive = log_in("olive")
    for next_path in [f"/settings/security/keys/{team.keys['gina'].id}", f"/settings/security/keys/{2**63}",
                      "/settings/security/keys/1/roll", "/settings/security/keys/x", "//evil.example/",
                      "/settings/security/keys/1/", "https://evil.example/settings/security/keys/1", "\x00"]:
        response = olive.post("/orgs/switch", data={"org": "acme", "next": next_path})
        assert (response.status_code, response.location) == (302, "/settings/security"), next_path


def test_the_switch_comes_back_to_the_key_page_by_its_own_address_never_another_host(team, log_in):
    """The router takes "////settings/..." for the key's page too; sent back as given, a browser
    would read "//settings" as a host."""
    olive = log_in("olive")
    path = f"/settings/security/keys/{team.keys['tess'].id}"
    for next_path in ["/" + path, "///" + path, "/settings//security/keys/" + str(team.keys['tess'].id)]:
        response = olive.post("/orgs/switch", data={"org": "acme", "next": next_path})
        assert response.status_code == 302 and response.location in (path, "/settings/security"), next_path
        assert not response.location.startswith("//")


def test_a_strangers_key_is_the_same_404_as_no_key_in_the_services_own_words(team, log_in):
    olive = log_in("olive")  # Acme's owner, not a member of Globex
    olive.get("/settings/security")  # shows the switch's flash, which the next page would
    strangers = olive.get(f"/settings/security/keys/{team.keys['gina'].id}", headers=HTML)
    none = olive.get("/settings/security/keys/999999", headers=HTML)
    assert strangers.status_code == none.status_code == 404
    assert strangers.content_type == "text/html; charset=utf-8"

    def without_token(response):
        return re.sub(r'name="csrf_token" value="[^"]+"', "", page(response))

    assert without_token(strangers) == without_token(none)
    assert ("404 Not Found There is nothing here: the address is mistyped or out of date, or what it named is gone "
            "or not yours to see.") in text(strangers)
    for secret in ("Globex", "globex", "gina", team.keys["gina"].display_prefix, "spelling"):
        assert secret not in page(strangers)
    as_json = olive.get(f"/settings/security/keys/{team.keys['gina'].id}")
    assert as_json.get_json() == olive.get("/settings/security/keys/999999").get_json()
    assert as_json.get_json()["error"]["code"] == "not_found"


def test_every_web_404_is_the_services_own_page(logged_in):
    for path in ["/no-such-page", "/settings/nope", "/static/nope.css", "/settings/security/keys/1"]:
        response = logged_in.get(path, headers=HTML)
        assert response.status_code == 404, path
        assert "There is nothing here" in page(response) and "spelling" not in page(response), path


def leaked(user, **report):
    """A key of the user's revoked as leaked: through POST /api/v1/keys/revoke, or with GitHub's report."""
    key, secret = keyactions.issue_key(user, "Leaky", "production")
    assert keyactions.revoke_key(auth.authenticate(secret), leaked=True, report=report or None)
    return ApiKey.get_by_id(key.id)


def status(client, key):
    """The text of the key page's Status."""
    html = page(client.get(f"/settings/security/keys/{key.id}"))
    status = html.split('<dd id="status">', 1)[1].split("</dd>", 1)[0]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", status)).strip()


def test_a_key_revoked_as_leaked_says_who_reported_it_where_and_when(logged_in, user):
    key = leaked(user, source="github", url=GITHUB_URL)
    assert (key.leak_report, key.leak_url) == ("github", GITHUB_URL)
    when = key.revoked_at.strftime("%Y-%m-%d %H:%M")
    assert status(logged_in, key) == f"Revoked: reported by GitHub at {GITHUB_URL} on {when} UTC"
    assert f'<a href="{GITHUB_URL}">{GITHUB_URL}</a>' in page(logged_in.get(f"/settings/security/keys/{key.id}"))

    key = leaked(user)
    assert (key.leak_report, key.leak_url) == ("api", None)
    when = key.revoked_at.strftime("%Y-%m-%d %H:%M")
    assert status(logged_in, key) == f"Revoked: reported with POST /api/v1/keys/revoke on {when} UTC"

    key = leaked(user, source="github", url="")
    assert status(logged_in, key) == f"Revoked: reported by GitHub on {key.revoked_at.strftime('%Y-%m-%d %H:%M')} UTC"


def test_a_reported_address_that_is_not_https_is_text_not_a_link(logged_in, user):
    key = leaked(user, source="github", url="javascript:alert(1)")
    html = page(logged_in.get(f"/settings/security/keys/{key.id}"))
    assert "at javascript:alert(1) on" in html and 'href="javascript' not in html


def test_a_key_revoked_otherwise_says_only_when(logged_in, user):
    key, _ = keyactions.issue_key(user, "Plain", "production")
    keyactions.revoke_key(key)
    key = ApiKey.get_by_id(key.id)
    assert key.leak_report is None
    assert status(logged_in, key) == f"Revoked {key.revoked_at.strftime('%Y-%m-%d %H:%M')} UTC"
