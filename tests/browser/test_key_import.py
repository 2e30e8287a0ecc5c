"""The Organisation tab's Import keys form in headless Chromium against the real server, at 1280 and
390 px with axe-core clean: a file with a refused line lists it with its reason, the good lines'
keys answer the API at once, and a dry run of a good file says what it would import. With
UPDATE_SCREENSHOTS=1 it saves docs/key-import.png and docs/phone-key-import.png."""

import pytest
import requests
from browsing import DESKTOP, PHONE, PageProblems, painted, sign_up
from importfiles import bcrypt_line, jsonl, made_secret, sha256_hex

try:
    from playwright.sync_api import expect
except ImportError:
    pass


def upload(page, data):
    page.get_by_label("JSON Lines file of keys another system issued").set_input_files(
        files=[{"name": "keys.jsonl", "mimeType": "application/jsonl", "buffer": data}])


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280px", "390px"])
def test_a_file_is_imported_its_refused_line_listed_and_its_keys_answer(open_page, server, screenshots, viewport):
    page = open_page(viewport)
    sign_up(page, f"ingrid{viewport['width']}")
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Organisation").click()
    problems = PageProblems()
    problems.look(page, "the Organisation tab with Import keys")
    secrets = [made_secret(), made_secret("rails_tok_")]
    upload(page, jsonl(sha256_hex(secrets[0], name="Customer A"), bcrypt_line(secrets[1], name="Customer B"),
                       {"hash": "00", "hash_scheme": "sha256-hex", "prefix": "acme_live_", "name": "Broken"}))
    page.get_by_role("button", name="Import keys").click()
    report = page.locator("#import-report")
    expect(report).to_contain_text("2 of 3 lines imported, 1 refused.")
    expect(report.get_by_role("table")).to_contain_text("a sha256-hex hash is 64 hexadecimal digits.")
    problems.look(page, "the import's report with a refused line")
    painted(page)
    page.screenshot(path=screenshots / f"{'phone-' if viewport is PHONE else ''}key-import.png", full_page=True)
    for secret in secrets:
        answer = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": secret}, timeout=30)
        assert answer.status_code == 200, answer.text

    upload(page, jsonl(sha256_hex(made_secret())))
    page.get_by_label("Only check the file: import nothing").check()
    page.get_by_role("button", name="Import keys").click()
    expect(page.get_by_role("status").first).to_contain_text("1 of 1 line would be imported, 0 refused.")
    page.get_by_role("navigation", name="Profile Settings").get_by_role("link", name="Security").click()
    expect(page.locator("table.keys")).to_contain_text("Customer A")
    assert page.locator("table.keys tr[id^=key-]").count() == 2
    assert problems == {}
