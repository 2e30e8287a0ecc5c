"""tools/githubreport.py, GitHub's part for trying secret scanning locally: its keys document and
signature are what the service's own reading and check accept, its key pair is kept between runs
and readable by its owner only, and it serves keys only on this machine (its run against a live
server: tests/live/test_recipes.py)."""

import json

import pytest

from integrations import githubkeys
from tools import githubreport


def test_its_document_and_signature_are_what_the_service_accepts(tmp_path):
    key = githubreport.private_key(tmp_path / "key.pem")
    keys = githubkeys.parse_keys(json.dumps(githubreport.keys_document(key)).encode())
    body = githubreport.report(["sk_live_one", "sk_live_two"], "https://github.com/o/r/blob/main/x.py")
    headers = githubreport.signed_headers(key, body)
    public = keys[headers["Github-Public-Key-Identifier"]]
    assert githubkeys.signature_holds(public, body, headers["Github-Public-Key-Signature"])
    assert not githubkeys.signature_holds(public, body + b" ", headers["Github-Public-Key-Signature"])
    assert [entry["token"] for entry in json.loads(body)] == ["sk_live_one", "sk_live_two"]
    assert {entry["type"] for entry in json.loads(body)} == {"api_key_demo_service_key"}


def test_its_key_pair_is_kept_between_runs_for_its_owner_alone(tmp_path):
    path = tmp_path / "instance" / "key.pem"
    first = githubreport.key_identifier(githubreport.private_key(path))
    assert githubreport.key_identifier(githubreport.private_key(path)) == first
    assert len(first) == 64
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("url, address", [
    ("http://127.0.0.1:8700/keys", ("127.0.0.1", 8700)),
    ("http://localhost/keys", ("localhost", 80)),
    ("http://[::1]:8701/", ("::1", 8701)),
])
def test_it_serves_the_keys_where_a_loopback_keys_url_says(url, address):
    assert githubreport.keys_address(url) == address


@pytest.mark.parametrize("url", ["https://api.github.com/meta/public_keys/secret_scanning",
                                 "https://127.0.0.1:8700/keys", "http://10.0.0.5:8700/keys", "not a url"])
def test_a_keys_url_it_cannot_serve_ends_it_with_a_sentence_and_no_key_made(tmp_path, capsys, url):
    assert githubreport.main(["sk_live_x", "--keys-url", url, "--key-file", str(tmp_path / "key.pem")], {}) == 1
    assert capsys.readouterr().err == (f"The keys URL is {url}: give the service (GITHUB_SECRET_SCANNING_KEYS_URL) "
                                       "and this tool one on this machine, such as http://127.0.0.1:8700/keys, where "
                                       "this tool serves the keys.\n")
    assert not (tmp_path / "key.pem").exists()
