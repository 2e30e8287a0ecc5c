"""The docs' recipes for trying the service on one machine, run as written, block by block, in a
shell: docs/webhooks.md's "Trying it on your own machine" (tools/webhookreceiver.py, `python app.py`,
an endpoint, key events, a failing receiver's retries, Recover), docs/leaked-keys.md's
(tools/githubreport.py's signed report revoking a key) and docs/importing-keys.md's (keys moved
from Unkey, from an app's bcrypt digests and from SHA-256 hex digests in PostgreSQL). Only the
ports, the database's folder, the report tool's key file and the source tables are the test's own."""

import hashlib
import json
import re
import shutil
import subprocess

import bcrypt
import psycopg
import services
from liveserver import ROOT, Server, free_port, service_env, wait_for

SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)


def recipe(page, heading, **replacements):
    """The ```sh blocks of the page's section under `## heading`, in order, each text of
    replacements replaced (the documented ports and folders by the test's)."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = SH_BLOCK.findall(section)
    for old, new in replacements.items():
        assert old in section, old
        blocks = [block.replace(old, new) for block in blocks]
    return blocks


def run(block, env):
    """Run a block of commands as pasted into a shell that stops at the first failure; its stdout."""
    done = subprocess.run(["sh", "-e", "-c", block], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def deliveries(receiver):
    """(webhook-id, event, status) of each delivery the receiver printed, in order."""
    return [(message_id, event, int(status)) for message_id, status, event in re.findall(
        r"POST /demo webhook-id: (\S+) -> (\d+)\n  \{\"type\":\"([^\"]+)\"", receiver.output())]


def test_the_webhook_recipe_delivers_retries_and_recovers_as_it_says(tmp_path):
    port, receiver_port = free_port(), free_port()
    env = service_env(tmp_path, PORT=str(port))
    del env["DATABASE_URL"]  # the recipe's own
    start_receiver, start_service, first_events, failing, attempts, recover = recipe(
        "webhooks.md", "Trying it on your own machine",
        **{"9000": str(receiver_port), ":5000/": f":{port}/", "$PWD/instance/": f"{tmp_path}/",
           "rm -f instance/": f"rm -f {tmp_path}/"})
    receiver = Server(["sh", "-e", "-c", start_receiver], env, receiver_port, tmp_path / "receiver.log")
    try:
        service = Server(["sh", "-e", "-c", start_service], env, port, tmp_path / "service.log")
        try:
            added = run(first_events, env)
            # The third terminal's later blocks run with the settings its first one exported.
            [settings] = [line for line in first_events.splitlines() if line.startswith("export ")]
            failing, attempts, recover = (f"{settings}\n{block}" for block in (failing, attempts, recover))
            assert added.startswith(f"Added webhook endpoint 1 for demo: http://127.0.0.1:{receiver_port}/demo (*).")
            assert added.splitlines()[-1] == '{"revoked":true,"api_key_name":"first","secret":"current"}'
            wait_for(lambda: [(event, status) for _, event, status in deliveries(receiver)]
                     == [("key.created", 200), ("key.revoked_as_leaked", 200)])

            run(failing, env)
            wait_for(lambda: len(deliveries(receiver)) == 5)
            [(failed_id, event, _)] = {(message_id, event, status) for message_id, event, status
                                       in deliveries(receiver)[2:]}
            assert event == "key.created" and "deliveries are answered 500 from now on" in receiver.output()
            # The third attempt is recorded, and its message failed, once the receiver's answer is in.
            wait_for(lambda: len(run(attempts, env).splitlines()) == 5)
            listed = [line.split("\t") for line in run(attempts, env).splitlines()]
            assert [(line[0], line[2], line[3], line[4]) for line in listed[:3]] == [
                (failed_id, "key.created", "HTTP 500", str(n)) for n in (3, 2, 1)]
            assert [(line[2], line[3]) for line in listed[3:]] == [("key.revoked_as_leaked", "HTTP 200"),
                                                                  ("key.created", "HTTP 200")]

            assert run(recover, env).splitlines()[-1].startswith(
                "Recovering 1 failed message of endpoint 1 made since ")
            wait_for(lambda: deliveries(receiver)[5:] == [(failed_id, "key.created", 200)])
        finally:
            output = service.output()
            service.stop()
        assert "Traceback" not in output
    finally:
        receiver.stop()


def test_the_github_recipe_revokes_a_key_with_a_report_signed_by_the_tools_own_key(tmp_path):
    port, keys_port = free_port(), free_port()
    env = service_env(tmp_path, PORT=str(port))
    key_file = tmp_path / "githubreport-key.pem"
    start_service, report = recipe(
        "leaked-keys.md", "Trying it on your own machine",
        **{"8700": str(keys_port), ":5000/": f":{port}/",
           "python -m tools.githubreport": f"python -m tools.githubreport --key-file {key_file}"})
    service = Server(["sh", "-e", "-c", start_service], env, port, tmp_path / "service.log")
    try:
        said = run(report, env).splitlines()
        assert said[:3] == [f"Serving the public keys at http://127.0.0.1:{keys_port}/keys (key identifier "
                             f"{tools_identifier(key_file)[:16]}...).",
                             "The service read the public keys (GET /keys).",
                             f"POST http://127.0.0.1:{port}/api/v1/integrations/github/secret-scanning: HTTP 200"]
        assert [entry["label"] for entry in json.loads(said[3])] == ["true_positive", "false_positive"]
        assert json.loads(said[4])["error"]["code"] == "invalid_api_key"
        assert said[5].split("\t")[1] == "key.revoked_as_leaked" and said[5].endswith(") reported by GitHub")
        # A second run signs with the kept key, which the service verifies without reading the keys again.
        again = run(report.replace("--name leaked", "--name leaked-again"), env).splitlines()
        assert again[1].endswith(": HTTP 200") and "The service read" not in "\n".join(again)
        assert [entry["label"] for entry in json.loads(again[2])] == ["true_positive", "false_positive"]
        assert key_file.stat().st_mode & 0o777 == 0o600
    finally:
        output = service.output()
        service.stop()
    assert "Traceback" not in output
    assert "GitHub reported 2 tokens: 1 of this service's secrets, 1 revoked now." in output


def test_the_import_recipes_move_keys_from_unkey_from_bcrypt_digests_and_from_hex_digests(tmp_path):
    if shutil.which("psql") is None:
        services.unavailable("psql (PostgreSQL's client) is not installed")
    port = free_port()
    env = service_env(tmp_path, PORT=str(port), SOURCE_DATABASE_URL=services.postgres_url())
    del env["DATABASE_URL"]  # the recipe's own
    folders = {"$PWD/instance/": f"{tmp_path}/", ":5000/": f":{port}/", "> keys.jsonl": f"> {tmp_path}/keys.jsonl",
               "import keys.jsonl": f"import {tmp_path}/keys.jsonl"}
    [start_service] = recipe("importing-keys.md", "Trying it on your own machine",
                             **{"$PWD/instance/": f"{tmp_path}/", "rm -f instance/": f"rm -f {tmp_path}/"})
    unkey_export, unkey_import = recipe("importing-keys.md", "From Unkey", **folders, **{
        "unkey-keys.jsonl": f"{tmp_path}/unkey-keys.jsonl"})
    [from_bcrypt] = recipe("importing-keys.md", "From a Rails or Django app that kept bcrypt digests", **folders)
    [from_hex] = recipe("importing-keys.md", "From a table of SHA-256 hex digests", **folders)
    service = Server(["sh", "-e", "-c", start_service], env, port, tmp_path / "service.log")
    try:
        said = run(f"{unkey_export}\n{unkey_import}", env).splitlines()
        assert said[:4] == ["line 1: ok", "1 of 1 line would be imported, 0 refused.", "line 1: 1",
                            "1 of 1 line imported, 0 refused."]
        assert json.loads(said[4])["api_key_name"] == "Customer 1"

        rails_secret, hex_secret = "rails_tok_" + "Qm3x" * 8, "tok_" + "Zp9w" * 8
        with psycopg.connect(env["SOURCE_DATABASE_URL"], autocommit=True) as source:
            source.execute("CREATE TABLE api_tokens (id serial, name text, token_prefix text, token_digest text)")
            source.execute("INSERT INTO api_tokens (name, token_prefix, token_digest) VALUES (%s, %s, %s)",
                           ("Rails customer", rails_secret[:14],
                            bcrypt.hashpw(rails_secret.encode(), bcrypt.gensalt(4)).decode()))
        said = run(from_bcrypt, {**env, "SECRET": rails_secret}).splitlines()
        assert said[:2] == ["line 1: 2", "1 of 1 line imported, 0 refused."]
        assert json.loads(said[2])["api_key_name"] == "Rails customer"

        with psycopg.connect(env["SOURCE_DATABASE_URL"], autocommit=True) as source:
            source.execute("DROP TABLE api_tokens")
            source.execute("CREATE TABLE api_tokens (id serial, name text, token_sha256 text)")
            source.execute("INSERT INTO api_tokens (name, token_sha256) VALUES (%s, %s)",
                           ("Hex customer", hashlib.sha256(hex_secret.encode()).hexdigest()))
        said = run(from_hex, {**env, "SECRET": hex_secret}).splitlines()
        assert said[:2] == ["line 1: 3", "1 of 1 line imported, 0 refused."]
        assert json.loads(said[2])["api_key_name"] == "Hex customer"
    finally:
        output = service.output()
        service.stop()
    assert "Traceback" not in output
    assert rails_secret not in output and hex_secret not in output


def tools_identifier(key_file):
    from cryptography.hazmat.primitives import serialization
    public = serialization.load_pem_private_key(key_file.read_bytes(), password=None).public_key()
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()
