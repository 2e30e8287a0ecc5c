"""Two-factor log-in on the real server (the Procfile's gunicorn): on SQLite with one worker, and on
PostgreSQL + Redis with two workers sharing the throttle and the replay check. Each browser has its
own client address (X-Forwarded-For behind TRUSTED_PROXIES=1)."""

import concurrent.futures
import re

import pytest
import services
from liveserver import PASSWORD, Browser, service_env
from twofactorsteps import code_at

secrets_seen = []


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def env(request, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("twofactor")
    if request.param == "sqlite":
        return service_env(tmp_path, TRUSTED_PROXIES="1", WEB_CONCURRENCY="1")
    return service_env(tmp_path, "postgresql", TRUSTED_PROXIES="1", WEB_CONCURRENCY="2",
                       RATELIMIT_STORAGE_URL=services.redis_url())


@pytest.fixture(scope="module")
def server_log_check():
    def no_secret_logged(output):
        assert not any(secret in output for secret in secrets_seen)
    return no_secret_logged


def start_setup(browser):
    """Start the set-up; return the secret its page shows."""
    page = browser.post("/settings/security/2fa/setup", form_page="/settings/security").text
    secret = re.search(r'data-totp-secret="([A-Z2-7]+)"', page)[1]
    secrets_seen.append(secret)
    return secret


def confirm(browser, code):
    return browser.post("/settings/security/2fa/enable", {"code": code}, form_page="/settings/security")


def enable(browser):
    """Turn 2FA on; return (secret, recovery codes)."""
    secret = start_setup(browser)
    response = confirm(browser, code_at(secret))
    assert response.status_code == 200, response.text
    return secret, re.findall(r'class="recovery-code">([A-Z2-7-]+)<', response.text)


def log_out(browser):
    browser.post("/logout", form_page="/settings/profile")
    assert not browser.logged_in()


def second_step(browser, code):
    return browser.post("/login/2fa", {"code": code})


def test_enable_log_in_with_a_code_refuse_wrong_and_reused_codes_recover_once_and_disable(server):
    browser = Browser(server).signup()
    secret, codes = enable(browser)
    assert len(codes) == 10
    log_out(browser)

    response = browser.login(browser.username)
    assert response.status_code == 302 and response.headers["Location"] == "/login/2fa"
    assert not browser.logged_in()
    assert second_step(browser, "000000").status_code == 400
    code = code_at(secret, 1)
    assert second_step(browser, code).status_code == 302 and browser.logged_in()

    log_out(browser)
    browser.login(browser.username)
    assert second_step(browser, code).status_code == 400  # used once already
    assert second_step(browser, codes[0]).status_code == 302 and browser.logged_in()
    log_out(browser)
    browser.login(browser.username)
    assert second_step(browser, codes[0]).status_code == 400  # a recovery code works once
    assert second_step(browser, codes[1]).status_code == 302 and browser.logged_in()

    form = "/settings/security"
    assert browser.post("/settings/security/2fa/disable", {"password": "wrong", "code": codes[2]},
                        form_page=form).status_code == 400
    assert browser.post("/settings/security/2fa/disable", {"password": PASSWORD, "code": "000000"},
                        form_page=form).status_code == 400
    response = browser.post("/settings/security/2fa/disable", {"password": PASSWORD, "code": codes[2]},
                            form_page=form)
    assert response.status_code == 302
    log = browser.get("/settings/security").text
    for event in ("user.2fa_enabled", "user.2fa_failed", "user.recovery_code_used", "user.2fa_disabled"):
        assert event in log
    log_out(browser)
    assert browser.login(browser.username).headers["Location"] == "/settings/profile"


def test_one_code_sent_by_two_browsers_at_once_passes_once(server):
    """Two pending log-ins of one account (on two workers where there are two) race one code."""
    owner = Browser(server).signup()
    secret, _ = enable(owner)
    log_out(owner)
    browsers = [Browser(server) for _ in range(4)]
    for browser in browsers:
        assert browser.login(owner.username).headers["Location"] == "/login/2fa"
    code = code_at(secret, 1)
    tokens = [re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/login/2fa").text)[1]
              for browser in browsers]

    def send(pair):
        browser, token = pair
        return browser.http.post(browser.base + "/login/2fa", data={"code": code, "csrf_token": token},
                                 allow_redirects=False, timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(len(browsers)) as pool:
        statuses = sorted(pool.map(send, zip(browsers, tokens)))
    assert statuses == [302, 400, 400, 400]


def test_code_guesses_past_the_throttle_are_refused_without_locking_the_owner_out(server):
    owner = Browser(server).signup()
    secret, _ = enable(owner)
    log_out(owner)
    attacker = Browser(server)
    statuses = []
    for guess in ["111111", "AAAA-BBBB-CCCC-DDDD"] * 4:
        if attacker.get("/login/2fa").status_code != 200:
            attacker.login(owner.username)
        statuses.append(second_step(attacker, guess).status_code)
    assert statuses[:5] == [400] * 5 and set(statuses[5:]) == {429}
    assert second_step(attacker, code_at(secret, 1)).status_code == 429  # even a right one
    # The owner, from their own address, is not locked out.
    owner.login(owner.username)
    assert second_step(owner, code_at(secret, 1)).status_code == 302 and owner.logged_in()


def test_codes_written_with_dashes_or_spaces_count_against_the_per_account_cap(server):
    """Guesses from many addresses, on every worker, meet one cap however the code is written."""
    owner = Browser(server).signup()
    secret, codes = enable(owner)
    log_out(owner)
    statuses = []
    for guess in ["000-000", "000 000", "00 00-00"] * 4:
        attacker = Browser(server)
        attacker.login(owner.username)
        statuses.append(second_step(attacker, guess).status_code)
    assert statuses == [400] * 10 + [429] * 2
    owner.login(owner.username)
    code = code_at(secret, 1)
    assert second_step(owner, f"{code[:3]} {code[3:]}").status_code == 429
    assert second_step(owner, codes[0]).status_code == 302 and owner.logged_in()


def test_a_set_up_s_secret_is_its_session_s_alone(server):
    """On every worker: a second session of the account starting the set-up gets its own secret,
    and neither can confirm the other's; after "Sign out everywhere" the secret is gone."""
    owner = Browser(server).signup()
    other = Browser(server)
    other.login(owner.username)
    noted = start_setup(other)
    secret = start_setup(owner)
    assert secret != noted
    assert confirm(owner, code_at(noted)).status_code == 400
    owner.post("/settings/security/sessions/revoke", form_page="/settings/security")
    owner.login(owner.username)
    assert not other.logged_in()
    assert confirm(owner, code_at(secret)).status_code == 302  # no set-up waiting any more
    assert confirm(owner, code_at(start_setup(owner))).status_code == 200
