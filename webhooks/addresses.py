"""Where a webhook may go: http and https URLs whose host is, and resolves only to, public
addresses. The check is made on the address actually connected to, at every connection, and the
connection goes to that checked address (a name that re-resolves elsewhere cannot switch it)."""

import ipaddress
import socket
from urllib.parse import quote, urlsplit, urlunsplit

import gevent
import gevent.lock

from store.connections import greenlets_share_thread

MAX_URL_LENGTH = 2000
SCHEMES = {"http": 80, "https": 443}
# Addresses of the NAT64 prefix carry an IPv4 address in their last 32 bits.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Refused whatever this Python's ipaddress says, so that the rule is the same on every version:
# site-local and documentation ranges (3.11 to 3.13 call fec0::/10 and 3fff::/20 global), and the
# IETF protocol assignments, which versions count differently (3.11 and 3.12 call 192.0.0.8-10
# global; 3.13 calls 2001:1::1, 2001:3::/32 and 2001:20::/28 global).
REFUSED_NETWORKS = [ipaddress.ip_network(network) for network in (
    "fec0::/10",
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20",
    "192.0.0.0/24", "2001::/23",
)]
# What a URL's path and query may hold as they are; anything else (not ASCII, say) is
# percent-encoded, since http.client sends the request line in ASCII. % keeps existing escapes.
URL_SAFE = "/:@!$&'()*+,;=?%~"
LOOKUPS_AT_ONCE = 4
lookups = gevent.lock.BoundedSemaphore(LOOKUPS_AT_ONCE)


class RefusedAddress(ValueError):
    """The URL, or the address its host resolves to, is not one a webhook may be sent to."""


def parse_url(url):
    """(scheme, host, port) of a URL a webhook may be sent to; RefusedAddress with a sentence otherwise."""
    url = url.strip()
    if not url or len(url) > MAX_URL_LENGTH or not url.isprintable() or " " in url:
        raise RefusedAddress(f"A webhook URL is an http:// or https:// URL of at most {MAX_URL_LENGTH} characters, "
                             "without spaces.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise RefusedAddress("That webhook URL cannot be read; check its host and port.") from None
    if parts.scheme.lower() not in SCHEMES or not parts.hostname:
        raise RefusedAddress("A webhook URL starts with http:// or https:// and names a host.")
    if parts.username is not None or parts.password is not None:
        raise RefusedAddress("A webhook URL cannot hold a user name or password.")
    if parts.fragment:
        raise RefusedAddress("A webhook URL cannot have a #fragment.")
    if port == 0:
        raise RefusedAddress("A webhook URL's port is between 1 and 65535.")
    return parts.scheme.lower(), parts.hostname, port or SCHEMES[parts.scheme.lower()]


def unwrapped(address):
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, NAT64, 6to4), else the address itself."""
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def is_public(address):
    """True for an address a webhook may reach: global, and not loopback, private, link-local,
    site-local, multicast, unspecified, reserved, documentation or a protocol assignment."""
    address = unwrapped(ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address)
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_loopback
                                      or address.is_link_local or address.is_private or address.is_unspecified
                                      or any(address in network for network in REFUSED_NETWORKS))


def resolve(host, port):
    """The (family, type, proto, sockaddr) a host name or literal resolves to; RefusedAddress when none."""
    found, error = bounded_lookup(host, port) if greenlets_share_thread() else lookup(host, port)
    if error is not None:
        raise RefusedAddress(f"The host {host!r} cannot be resolved ({error}).")
    return [(family, kind, proto, sockaddr) for family, kind, proto, _, sockaddr in found]


def lookup(host, port):
    """(getaddrinfo's answer, None), or (None, the error)."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), None
    except (socket.gaierror, UnicodeError) as error:
        return None, error


def bounded_lookup(host, port):
    """lookup() under gevent, at most LOOKUPS_AT_ONCE at a time in the process. Each runs in one of
    the hub's resolver threads (10), and an attempt cut at its deadline frees its greenlet but not
    the thread: without a bound, a receiver's slow names could take every thread and stall every
    lookup of the worker. So a slot is given back when the thread's lookup ends, not when the
    attempt stops waiting for it."""
    lookups.acquire()
    try:
        pending = gevent.spawn(lookup, host, port)
    except BaseException:
        lookups.release()
        raise
    pending.link(lambda _: lookups.release())
    return pending.get()


def check_url(url, allow_private=False):
    """Refuse (RefusedAddress) a URL that is not http(s), or whose host is or resolves to an address
    that is not public (unless allow_private); return the URL, stripped, its path and query
    percent-encoded where they hold what a request line cannot."""
    _, host, port = parse_url(url)
    if not allow_private:
        for *_, sockaddr in resolve(host, port):
            if not is_public(sockaddr[0]):
                raise RefusedAddress(refusal(host, sockaddr[0]))
    parts = urlsplit(url.strip())
    return urlunsplit(parts._replace(path=quote(parts.path, safe=URL_SAFE), query=quote(parts.query, safe=URL_SAFE)))


def refusal(host, address):
    shown = host if host == address else f"{host} ({address})"
    return (f"Webhooks are not sent to {shown}: not a public address (WEBHOOK_ALLOW_PRIVATE=1 allows it for "
            "local tests).")


def checked_connection(allow_private, deadline):
    """A replacement for http.client's socket.create_connection: resolves the host, refuses every
    address that is not public (unless allow_private), and connects to a checked address itself,
    with a socket bound by the attempt's deadline (webhooks/deadlines.py)."""

    def create_connection(address, timeout=None, source_address=None, **_):
        host, port = address
        last_error = None
        for family, kind, proto, sockaddr in resolve(host, port):
            if not allow_private and not is_public(sockaddr[0]):
                last_error = RefusedAddress(refusal(host, sockaddr[0]))
                continue
            sock = deadline.socket(socket.socket, family, kind, proto)
            try:
                sock.connect(sockaddr)
                return sock
            except OSError as error:
                sock.close()
                last_error = error
        raise last_error or RefusedAddress(f"The host {host!r} has no address.")

    return create_connection
