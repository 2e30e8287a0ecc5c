"""webhooks/addresses.py: where webhooks may go. Addresses that are not public are refused when an
endpoint is added and again when a delivery connects (a fake resolver for a name that turns
private); only http and https; a path and query percent-encoded."""

import re
import socket

import pytest

from webhooks import addresses, delivery, endpoints
from webhooks.models import DELIVERED, PENDING, WebhookEndpoint

REFUSED = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "::", "::1",
           "::ffff:127.0.0.1", "::ffff:10.0.0.1", "fc00::1", "fe80::1", "224.0.0.1", "ff02::1", "100.64.0.1",
           "255.255.255.255", "64:ff9b::a00:1", "2002:7f00:1::1", "192.0.0.8", "192.0.0.9", "192.0.0.170"]


# Refused by name whatever this Python's ipaddress says: site-local and documentation addresses, and the
# protocol assignments Python versions disagree about (3.11 and 3.12 call fec0::/10, 3fff::/20 and
# 192.0.0.10 global; 3.13 calls 2001:1::1, 2001:3::/32 and 2001:20::/28 global).
REFUSED_BY_NAME = ["fec0::1", "feff:ffff::1", "3fff::1", "3fff:fff:ffff::1", "192.0.2.1", "198.51.100.7", "203.0.113.9",
            "2001:db8::1", "192.0.0.10", "2001:1::1", "2001:3::1", "2001:20::1", "::ffff:203.0.113.9",
            "2002:c000:201::1", "64:ff9b::c633:6407"]


PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "3fff:1000::1", "2002:808:808::1"]


@pytest.mark.parametrize("address", REFUSED + REFUSED_BY_NAME)
def test_addresses_that_are_not_public_are_refused(address):
    assert not addresses.is_public(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address):
    assert addresses.is_public(address)


@pytest.mark.parametrize("url", ["http://127.0.0.1/", "http://10.0.0.1/hook", "http://169.254.169.254/latest",
                                 "http://[::ffff:127.0.0.1]:8080/", "http://0.0.0.0/", "http://[::1]/",
                                 "http://localhost/", "https://192.168.0.10/"])
def test_a_private_url_is_refused_at_registration(app, user, url):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    with pytest.raises(addresses.RefusedAddress, match="WEBHOOK_ALLOW_PRIVATE"):
        endpoints.add_endpoint(user, url)
    app.config["WEBHOOK_ALLOW_PRIVATE"] = True
    endpoints.add_endpoint(user, url)


@pytest.mark.parametrize("url", ["ftp://example.com/", "example.com/hook", "http://user:pw@example.com/",
                                 "http:///path", "http://example.com:99999/", "javascript:alert(1)",
                                 "http://exa mple.com/", "http://example.com/\x00", "http://93.184.216.34:0/"])
def test_urls_that_are_not_http_are_refused(app, user, url):
    with pytest.raises(ValueError):
        endpoints.add_endpoint(user, url)


def test_a_path_and_query_that_are_not_ascii_are_percent_encoded_when_the_endpoint_is_added(app, user, receiver):
    endpoint, secret = endpoints.add_endpoint(user, f"{receiver.url}/réception/%41?für=größe&ok=1")
    assert endpoint.url == f"{receiver.url}/r%C3%A9ception/%41?f%C3%BCr=gr%C3%B6%C3%9Fe&ok=1"
    receiver.secrets["/r%C3%A9ception/%41?f%C3%BCr=gr%C3%B6%C3%9Fe&ok=1"] = secret
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = delivery.deliver_due(app)
    assert (outcome.status, state) == (204, DELIVERED)


@pytest.fixture
def resolver(monkeypatch):
    """answers: the address each test host name resolves to; getaddrinfo resolves every other name."""
    real, answers = socket.getaddrinfo, {}

    def fake(host, port, *args, **kwargs):
        if host not in answers:
            return real(host, port, *args, **kwargs)
        if ":" in answers[host]:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (answers[host], port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return answers


def test_a_name_that_resolves_to_a_private_address_at_delivery_is_refused(app, user, resolver):
    """DNS rebinding: a public address when the endpoint is added, loopback when a delivery connects."""
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    resolver["hooks.example.test"] = "93.184.216.34"
    endpoint, _ = endpoints.add_endpoint(user, "http://hooks.example.test/in")
    resolver["hooks.example.test"] = "127.0.0.1"
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = delivery.deliver_due(app)
    assert outcome.status is None and "hooks.example.test (127.0.0.1)" in outcome.error and state == PENDING


@pytest.mark.parametrize("address", REFUSED_BY_NAME)
def test_site_local_documentation_and_protocol_addresses_are_refused_when_added(app, user, resolver, address):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    resolver["hooks.example.test"] = address
    literal = f"[{address}]" if ":" in address else address
    for url in ["http://hooks.example.test/in", f"http://{literal}/in"]:
        with pytest.raises(addresses.RefusedAddress, match=f"Webhooks are not sent to .*{re.escape(address)}"):
            endpoints.add_endpoint(user, url)
    assert WebhookEndpoint.select().count() == 0


@pytest.mark.parametrize("address", REFUSED_BY_NAME)
def test_site_local_documentation_and_protocol_addresses_are_refused_at_connection(app, user, resolver, address):
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    resolver["hooks.example.test"] = "93.184.216.34"
    endpoint, _ = endpoints.add_endpoint(user, "http://hooks.example.test/in")
    resolver["hooks.example.test"] = address
    endpoints.send_test(endpoint)
    [(_, outcome, state)] = delivery.deliver_due(app)
    assert outcome.status is None and f"hooks.example.test ({address})" in outcome.error and state == PENDING


def test_localhost_is_refused_when_a_delivery_connects(app, user, receiver):
    endpoint, _ = endpoints.add_endpoint(user, receiver.url.replace("127.0.0.1", "localhost") + "/local")
    app.config["WEBHOOK_ALLOW_PRIVATE"] = False
    endpoints.send_test(endpoint)
    [(_, outcome, _)] = delivery.deliver_due(app)
    assert outcome.status is None and "not sent to localhost" in outcome.error
    assert receiver.received() == []
