"""An account's address on the real server in both run modes, with SQLite (text logs) and PostgreSQL
(JSON logs), its mails through a real SMTP server: sign-up's link, Send again, a change of address,
an address another account has (and two accounts racing for one), links that cannot act, the caps
(per account, per IP, and per address: new accounts asking for one stranger's address, one after
another and all at once on two instances of two workers), and a log that never holds a link's
token. Each browser has its own client address (X-Forwarded-For behind TRUSTED_PROXIES=1)."""

import concurrent.futures
import re
import time

import pytest
import requests
from liveserver import PASSWORD, Browser, service_env, start_instances, usernames
from mailserver import mail_server
from serverfixtures import each_run_mode, mailing

LINK = re.compile(r"https?://[^/\s]+(/email/(?:verify|change)/([A-Za-z0-9_-]{43}))")
# Every token a mail carried: none may be in the server's log.
tokens = set()


@pytest.fixture(scope="module")
def smtp():
    with mail_server() as server:
        yield server


@pytest.fixture(scope="module", params=[("sqlite", "text"), ("postgresql", "json")], ids=["sqlite", "postgresql"])
def env(request, tmp_path_factory, smtp):
    database, log_format = request.param
    return service_env(tmp_path_factory.mktemp("address"), database,
                       **mailing(smtp, TRUSTED_PROXIES="1", LOG_FORMAT=log_format))


server_mode = each_run_mode


@pytest.fixture(scope="module")
def server_log_check():
    def no_token_logged(output):
        assert tokens and not any(token in output for token in tokens)
        logged = re.findall(r"/email/(?:verify|change)/(\S*)", output)
        assert logged and all(rest.startswith("[redacted]") for rest in logged)
    return no_token_logged


def link_of(mail):
    """The path of the one link a mail carries, the same in its text and its HTML."""
    [(path, token)] = set(LINK.findall(mail.text))
    assert path in mail.html
    tokens.add(token)
    return path


def address(browser):
    return f"{browser.username}@example.com"


def mails_to(smtp, to, count=1):
    return smtp.wait_for(count, to=to)


def mail_of(smtp, to, subject, count=1):
    """The count-th mail with this subject to that address, once it came (mails of one moment come
    in any order: the sender sends several at once)."""
    deadline = time.monotonic() + 30
    while len(found := [mail for mail in smtp.mails if mail.to == to and mail.subject == subject]) < count:
        assert time.monotonic() < deadline, f"no mail {subject!r} to {to}"
        time.sleep(0.05)
    return found[count - 1]


def profile(browser):
    return browser.get("/settings/profile").text


def address_shown(browser):
    """The account's address as the Profile tab's facts give it."""
    return re.search(r"<dt>Email</dt>\s*<dd>(\S+)", profile(browser))[1]


def ask_change(browser, new_email, password=PASSWORD):
    return browser.post("/settings/profile/email", {"password": password, "email": new_email},
                        form_page="/settings/profile")


def test_sign_up_mails_a_link_whose_page_changes_nothing_and_whose_form_confirms(server, smtp):
    browser = Browser(server).signup()
    [mail] = mails_to(smtp, address(browser))
    assert mail.subject == "Confirm your email address" and PASSWORD not in mail.text + mail.html
    path = link_of(mail)
    assert "Not verified" in profile(browser)
    for fetcher in (requests.Session(), browser.http):  # a mail scanner, then the person's browser
        shown = fetcher.get(server.base + path, timeout=30)
        assert shown.status_code == 200 and "Confirm my address" in shown.text
    assert "Not verified" in profile(browser)
    confirmed = browser.post(path)
    assert (confirmed.status_code, confirmed.headers["Location"]) == (302, "/settings/profile")
    page = profile(browser)
    assert "Verified" in page and "Not verified" not in page and "Send again" not in page
    again = browser.post(path, form_page="/settings/profile")
    assert again.status_code == 410 and "This link was used already" in again.text


def test_a_verify_link_works_logged_out_and_logs_no_one_in(server, smtp):
    browser = Browser(server).signup()
    path = link_of(mails_to(smtp, address(browser))[0])
    stranger = Browser(server)
    response = stranger.post(path)
    assert (response.status_code, response.headers["Location"]) == (302, "/login")
    assert not stranger.logged_in() and "Verified" in profile(browser)


def test_send_again_mails_a_link_that_voids_the_older(server, smtp):
    browser = Browser(server).signup()
    older = link_of(mails_to(smtp, address(browser))[0])
    response = browser.post("/settings/profile/email/verify", form_page="/settings/profile")
    assert response.status_code == 302
    newer = link_of(mail_of(smtp, address(browser), "Confirm your email address", 2))
    refused = browser.get(older)
    assert refused.status_code == 410 and "A newer link was sent since" in refused.text
    assert browser.post(newer).status_code == 302 and "Verified" in profile(browser)


def test_a_change_of_address_end_to_end(server, smtp):
    browser = Browser(server).signup()
    old, new = address(browser), f"new-{browser.username}@example.com"
    response = ask_change(browser, new)
    assert (response.status_code, response.headers["Location"]) == (302, "/settings/profile")
    [link] = mails_to(smtp, new)
    notice = mail_of(smtp, old, "Your email address is being changed")
    assert new in notice.text
    assert "http" not in notice.text and "href" not in notice.html
    path = link_of(link)
    shown = browser.get(path)
    assert shown.status_code == 200 and "Use this address" in shown.text and old in profile(browser)
    done = browser.post(path)
    assert (done.status_code, done.headers["Location"]) == (302, "/settings/profile")
    page = profile(browser)
    assert new in page and "Verified" in page and f"A notice went to {old}" in page
    changed = mail_of(smtp, old, "Your email address was changed")
    assert new in changed.text and "http" not in changed.text
    assert browser.post(path, form_page="/settings/profile").status_code == 410


def test_a_wrong_password_or_an_injected_header_mails_nothing(server, smtp):
    browser = Browser(server).signup()
    mails_to(smtp, address(browser))
    wrong = ask_change(browser, f"new-{browser.username}@example.com", "not the password")
    assert wrong.status_code == 400 and "The password is not correct." in wrong.text
    for injected in (f"x-{browser.username}@example.com\r\nBcc: eve@example.com",
                     f"x-{browser.username}@example.com\nBcc: eve@example.com", "Eve <eve@example.com>"):
        assert ask_change(browser, injected).status_code == 400
    # A mail written after them arrives: had they written any, it would be there by now.
    browser.post("/settings/profile/email/verify", form_page="/settings/profile")
    mails_to(smtp, address(browser), 2)
    time.sleep(1.5)
    sent_to = {recipient for mail in smtp.mails for recipient in mail.rcpt_tos}
    assert "eve@example.com" not in sent_to and f"new-{browser.username}@example.com" not in sent_to
    assert not any(recipient.startswith(f"x-{browser.username}") for recipient in sent_to)


def test_another_accounts_address_is_answered_alike_and_refused_when_followed(server, smtp):
    asker, owner = Browser(server).signup(), Browser(server).signup()
    response = ask_change(asker, address(owner))
    assert response.status_code == 302 and f"A link was mailed to {address(owner)}" in profile(asker)
    path = link_of(mail_of(smtp, address(owner), "Confirm your new email address"))
    for method in (asker.get, asker.post):
        refused = method(path) if method == asker.get else asker.post(path, form_page="/settings/profile")
        assert refused.status_code == 409 and "That address now belongs to another account" in refused.text
    assert address(asker) in profile(asker)


def test_two_accounts_following_links_to_one_address_at_once_one_wins_and_no_500(server, smtp):
    first, second = Browser(server).signup(), Browser(server).signup()
    shared = f"shared-{first.username}@example.com"
    for browser in (first, second):
        assert ask_change(browser, shared).status_code == 302
    links = {}
    for mail in mails_to(smtp, shared, 2):
        links[re.search(r"the account (\S+)\.", mail.text)[1]] = link_of(mail)
    forms = []
    for browser in (first, second):
        token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get(links[browser.username]).text)[1]
        forms.append((browser, links[browser.username], token))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        statuses = list(pool.map(lambda form: form[0].http.post(
            server.base + form[1], data={"csrf_token": form[2]}, allow_redirects=False, timeout=30).status_code, forms))
    assert sorted(statuses) == [302, 409]
    assert sorted(address_shown(browser) == shared for browser in (first, second)) == [False, True]


@pytest.mark.parametrize("purpose", ["verify", "change"])
@pytest.mark.parametrize("token, statuses", [("nope", {404}), ("A" * 43, {404}), ("A" * 20_000, {400, 404, 414})])
def test_a_link_that_is_not_ours_is_refused(server, purpose, token, statuses):
    browser = Browser(server).signup()
    response = browser.get(f"/email/{purpose}/{token}")
    assert response.status_code in statuses and token not in response.text
    assert "Not verified" in profile(browser)


def test_send_again_is_capped_per_account(server, smtp):
    browser = Browser(server).signup()
    mails_to(smtp, address(browser))
    for _ in range(2):  # sign-up's link counts
        assert browser.post("/settings/profile/email/verify", form_page="/settings/profile").status_code == 302
    refused = browser.post("/settings/profile/email/verify", form_page="/settings/profile")
    assert refused.status_code == 429 and "3 links were mailed in the last hour" in refused.text


def test_send_again_counts_against_the_ip_allowance(server, smtp):
    ip = "10.77.0.1"
    browser = Browser(server, address=ip).signup()
    guesser = Browser(server, address=ip)
    for _ in range(19):  # another username each time: only the per-IP allowance (20 a minute) fills
        guesser.login(next(usernames), "a guess")
    assert browser.post("/settings/profile/email/verify", form_page="/settings/profile").status_code == 302
    refused = browser.post("/settings/profile/email/verify", form_page="/settings/profile")
    assert refused.status_code == 429 and "Too many requests from this address" in refused.text
    assert int(refused.headers["Retry-After"]) > 0


def stranger():
    """An address no test of the module's has mailed (the SMTP server serves every server of it)."""
    return f"stranger-{next(usernames)}@example.org"


def mails_to_stay(smtp, to, count):
    """The mails to that address once count came and a while after: none more may come."""
    mails_to(smtp, to, count)
    time.sleep(1.5)
    return [mail for mail in smtp.mails if mail.to == to]


def test_new_accounts_mail_one_strangers_address_three_times_and_the_fourth_form_says_so(server, smtp):
    """Issue 66's attack: each new account asks to move to one stranger's address."""
    target = stranger()
    askers = [Browser(server).signup() for _ in range(4)]
    for asker in askers[:3]:
        assert ask_change(asker, target).status_code == 302
    refused = ask_change(askers[3], target)
    assert refused.status_code == 429
    assert f"No more mail goes to {target} for now; try again later." in refused.text
    assert f"A link was mailed to {target}" not in profile(askers[3])
    mails = mails_to_stay(smtp, target, 3)
    assert [mail.subject for mail in mails] == ["Confirm your new email address"] * 3
    # Each link is its asker's (a mail scanner's fetch changes nothing).
    assert {re.search(r"the account (\S+)\.", mail.text)[1] for mail in mails} == {a.username for a in askers[:3]}
    assert all(requests.get(server.base + link_of(mail), timeout=30).status_code == 200 for mail in mails)
    assert "At most 3 links and invitations an hour go to one address" in " ".join(profile(askers[0]).split())


def test_accounts_racing_on_two_instances_of_two_workers_mail_one_address_three_times(env, smtp, tmp_path):
    """Eight accounts ask at once, through two instances of two workers each on the module's
    database, to move to one address: three are mailed, five are told, whichever worker counts."""
    target = stranger()
    servers = start_instances(tmp_path, dict(env, WEB_CONCURRENCY="2"))
    try:
        askers = [Browser(servers[n % 2]).signup() for n in range(8)]
        forms = [(asker, re.search(r'name="csrf_token" value="([^"]+)"', profile(asker))[1]) for asker in askers]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda form: form[0].http.post(
                form[0].base + "/settings/profile/email",
                data={"password": PASSWORD, "email": target, "csrf_token": form[1]},
                allow_redirects=False, timeout=30), forms))
        assert sorted(answer.status_code for answer in answers) == [302] * 3 + [429] * 5
        assert all(f"No more mail goes to {target} for now" in answer.text
                   for answer in answers if answer.status_code == 429)
        assert len(mails_to_stay(smtp, target, 3)) == 3
    finally:
        for server in servers:
            server.stop()
        logs = "".join(server.output() for server in servers)
    assert "Traceback" not in logs
