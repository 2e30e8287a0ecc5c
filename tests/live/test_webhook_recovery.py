"""Resend, recover and rotate against the real service: the command line changes the database, the
running server's sender delivers, and a receiver verifies each delivery with the
`standardwebhooks` library."""

import pytest
from liveserver import cli, make_key, run_cli, service_env, serving, wait_for
from services import rows
from webhookreceiver import receiving, verifies


@pytest.fixture
def receiver():
    with receiving() as receiver:
        yield receiver


def webhook_env(tmp_path, database="sqlite"):
    return service_env(tmp_path, database, WEBHOOK_ALLOW_PRIVATE="1", WEBHOOK_RETRY_SCHEDULE="1s")


def add_endpoint(env, receiver, path):
    secret = cli(env, "webhooks", "add", "carol", f"{receiver.url}{path}").strip().splitlines()[-1]
    receiver.secrets[path] = secret
    [(endpoint_id,)] = rows(env["DATABASE_URL"], "SELECT id FROM webhook_endpoints")
    return endpoint_id, secret


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_rotation_signs_with_both_secrets_and_a_receiver_on_either_verifies(tmp_path, receiver, database):
    env = webhook_env(tmp_path, database)
    make_key(env)
    endpoint_id, old = add_endpoint(env, receiver, "/carol")
    with serving(tmp_path, env) as server:
        new = cli(env, "webhooks", "rotate", str(endpoint_id), "--overlap", "1h").strip().splitlines()[-1]
        receiver.secrets["/carol"] = new
        cli(env, "keys", "create", "carol", "--name", "second", "--type", "development")
        [delivery] = receiver.wait_for(1)
        assert delivery.error is None and delivery.verified["type"] == "key.created"
        assert len(delivery.headers["webhook-signature"].split(" ")) == 2
        assert verifies(new, delivery) and verifies(old, delivery)
        cli(env, "webhooks", "rotate", str(endpoint_id), "--overlap", "0")
        cli(env, "keys", "create", "carol", "--name", "third", "--type", "development")
        receiver.wait_for(2)
        assert not verifies(new, receiver.received()[-1]) and not verifies(old, receiver.received()[-1])
    assert new not in server.output() and old not in server.output()


def test_failed_messages_recovered_from_the_command_line_are_delivered_by_the_server(tmp_path, receiver):
    env = webhook_env(tmp_path)
    make_key(env)
    endpoint_id, _ = add_endpoint(env, receiver, "/carol")
    receiver.answer = lambda delivery: 503
    with serving(tmp_path, env):
        cli(env, "keys", "create", "carol", "--name", "second", "--type", "development")
        first, second = receiver.wait_for(2)
        assert first.message_id == second.message_id

        def failed():
            return rows(env["DATABASE_URL"], "SELECT message_id FROM webhook_messages WHERE state = 'failed'")

        wait_for(failed)
        receiver.answer = lambda delivery: 204
        output = cli(env, "webhooks", "recover", str(endpoint_id), "--since", "1h")
        assert output.startswith(f"Recovering 1 failed message of endpoint {endpoint_id} made since ")
        third = receiver.wait_for(3)[-1]
        assert (third.message_id, third.body, third.error) == (first.message_id, first.body, None)
        lines = cli(env, "webhooks", "attempts", str(endpoint_id)).splitlines()
        assert [line.split("\t")[3:] for line in lines] == [["HTTP 204", "1"], ["HTTP 503", "2"], ["HTTP 503", "1"]]

        resent = run_cli(env, "webhooks", "resend", first.message_id)
        assert resent.returncode == 0, resent.stderr
        fourth = receiver.wait_for(4)[-1]
        assert (fourth.message_id, fourth.body) == (first.message_id, first.body)
