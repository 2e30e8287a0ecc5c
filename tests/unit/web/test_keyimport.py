"""The Organisation tab's Import keys form (who may use it: test_members.py), the page of an
imported key, and the Security tab of an organisation holding more keys than one page lists."""

import io
import re

from importfiles import bcrypt_line, jsonl, made_secret, sha256_hex

from accounts import users
from keys.models import ImportedKey
from models import ApiKey
from orgs import keyimports
from web import security

IMPORT = "/settings/organisation/import"


def form(logged_in, data, **fields):
    org_id = re.search(r'name="org_id" value="(\d+)"', logged_in.get("/settings/organisation").text)[1]
    return logged_in.post(IMPORT, data={"org_id": org_id, "file": (io.BytesIO(data), "keys.jsonl"), **fields})


def test_a_good_file_is_imported_and_the_tab_says_how_many(logged_in):
    response = form(logged_in, jsonl(sha256_hex(made_secret()), sha256_hex(made_secret())))
    assert response.status_code == 302
    page = logged_in.get(response.location).text
    assert "2 of 2 lines imported, 0 refused. They work from the next request" in page
    assert ImportedKey.select().count() == 2


def test_a_dry_run_says_what_would_be_imported_and_writes_nothing(logged_in):
    response = form(logged_in, jsonl(sha256_hex(made_secret())), dry_run="on")
    assert "1 of 1 line would be imported, 0 refused." in logged_in.get(response.location).text
    assert ImportedKey.select().count() == 0


def test_refused_lines_are_listed_with_their_reasons_and_the_good_ones_imported(logged_in):
    response = form(logged_in, jsonl(sha256_hex(made_secret()), '{"hash": "x"}', "<script>alert(1)</script>"))
    assert response.status_code == 400
    report = re.sub(r"\s+", " ", re.search(r'<div class="import-report".*?</div>', response.text, re.S)[0])
    assert "1 of 3 lines imported, 2 refused." in report
    assert '<td data-label="Line">2</td><td data-label="Reason">hash_scheme is required, a string.</td>' in report
    assert '<td data-label="Line">3</td><td data-label="Reason">not a JSON object.</td>' in report
    assert "<script>" not in response.text.split('id="import-report"')[1].split("</div>")[0]
    assert ImportedKey.select().count() == 1


def test_only_the_first_refusals_are_listed_and_the_rest_counted(logged_in):
    response = form(logged_in, b"{}\n" * 250)
    assert response.status_code == 400
    assert response.text.count('<td data-label="Reason">') == 200
    assert "the first 200 of\n              250" in response.text


def test_a_file_past_its_bounds_or_missing_is_a_400_with_a_sentence(logged_in):
    assert "at most 10,000 lines" in form(logged_in, b"{}\n" * 10_001).text
    org_id = re.search(r'name="org_id" value="(\d+)"', logged_in.get("/settings/organisation").text)[1]
    response = logged_in.post(IMPORT, data={"org_id": org_id})
    assert (response.status_code, "Choose a JSON Lines file to import." in response.text) == (400, True)


def test_a_body_past_the_file_s_bound_is_refused_before_it_is_read(logged_in):
    response = form(logged_in, b" " * (keyimports.MAX_BYTES + 70_000))
    assert response.status_code == 413


def test_a_form_drawn_for_another_organisation_changes_nothing(logged_in):
    response = logged_in.post(IMPORT, data={"org_id": "999", "file": (io.BytesIO(jsonl(sha256_hex(made_secret()))),
                                                                       "keys.jsonl")})
    assert response.status_code == 409 and ImportedKey.select().count() == 0


def test_a_member_sends_at_most_ten_import_forms_an_hour(logged_in):
    for _ in range(10):
        assert form(logged_in, b"{}\n").status_code == 400
    assert form(logged_in, b"{}\n").status_code == 429


def test_an_imported_key_s_page_says_so_with_its_external_id(logged_in, user):
    secret = made_secret("rails_tok_")
    [outcome] = keyimports.import_keys(users.personal_organisation_id(user),
                                       jsonl(bcrypt_line(secret, external_id="cus_42")))
    page = re.sub(r"\s+", " ", logged_in.get(f"/settings/security/keys/{outcome.key_id}").text)
    assert f"imported by its bcrypt hash; awaiting its first use, found by <code>{secret[:14]}</code>" in page
    assert "its id there: <code>cus_42</code>" in page
    assert logged_in.get("/api/v1/protected/test", headers={"X-API-Key": secret}).status_code == 200
    page = re.sub(r"\s+", " ", logged_in.get(f"/settings/security/keys/{outcome.key_id}").text)
    assert "imported by its bcrypt hash and rehashed to SHA-256 on its first use; its id there" in page


def test_the_security_tab_lists_a_page_of_keys_with_the_totals_of_all(logged_in, user):
    org_id = users.personal_organisation_id(user)
    keyimports.import_keys(org_id, jsonl(*(sha256_hex(made_secret(), name=f"customer {n}")
                                           for n in range(security.KEYS_SHOWN + 5))))
    ApiKey.update(total_requests=2).execute()
    page = logged_in.get("/settings/security").text
    assert page.count('<tr id="key-') == security.KEYS_SHOWN
    assert "customer 104" in page and "customer 4<" not in page
    assert "<dt>Counted, all time</dt><dd>210</dd>" in page
    older = re.search(r'href="(/settings/security\?keys_before=\d+)#keys-heading">Older keys', page)[1]
    rest = logged_in.get(older).text
    assert rest.count('<tr id="key-') == 5 and "customer 0<" in rest and "Newest keys" in rest


def test_a_page_of_keys_past_any_id_is_the_first_page(logged_in):
    for before in ("99999999999999999999", "-99999999999999999999", "9223372036854775808", "0"):
        assert logged_in.get(f"/settings/security?keys_before={before}").status_code == 200


def test_a_file_of_many_lines_past_max_body_bytes_is_taken_whole(logged_in):
    lines = [sha256_hex(made_secret(), name=f"customer {n}") for n in range(1500)]
    data = jsonl(*lines)
    assert len(data) > 3 * logged_in.application.config["MAX_BODY_BYTES"]
    response = form(logged_in, data)
    assert response.status_code == 302, response.text
    assert ImportedKey.select().count() == 1500
