"""Per-key IP allow-lists: reading the owner's entries into networks, and whether a client address
is one of them."""

import functools
import ipaddress
import re

MAX_ENTRIES = 100
# Far more than 100 entries need (an IPv6 network with its prefix is at most 43 characters, more with
# spaces), and little enough that a pasted file is refused before it is parsed.
MAX_TEXT_LENGTH = 6000
SEPARATORS = re.compile(r"[,\s]+")
# A mapped IPv4 address (::ffff:a.b.c.d) and the networks of them are stored as the IPv4 they mean.
MAPPED_IPV4 = ipaddress.IPv6Network("::ffff:0:0/96")


def parse(text):
    """The stored form of an allow-list the owner typed (addresses or CIDR networks, IPv4 or IPv6,
    separated by commas or new lines): its networks, normalised, without repeats, comma-separated;
    None when there are none (any address). Raise ValueError with a sentence naming bad entries."""
    text = text or ""
    if len(text) > MAX_TEXT_LENGTH:
        raise ValueError(f"An IP allow-list is at most {MAX_TEXT_LENGTH} characters.")
    entries = [entry for entry in SEPARATORS.split(text) if entry]
    networks, malformed = {}, []
    for entry in entries:
        network = network_of(entry)
        if network is None:
            malformed.append(entry)
        else:
            networks[network] = None
    if malformed:
        named = ", ".join(repr(entry[:50]) for entry in malformed[:5])
        more = f" and {len(malformed) - 5} more" if len(malformed) > 5 else ""
        if len(malformed) == 1:
            sentence = f"The IP allow-list entry {named} is not an IP address or CIDR network"
        else:
            sentence = f"The IP allow-list entries {named}{more} are not IP addresses or CIDR networks"
        raise ValueError(f"{sentence} (like 203.0.113.7, 198.51.100.0/24 or 2001:db8::/64).")
    if len(networks) > MAX_ENTRIES:
        raise ValueError(f"An IP allow-list has at most {MAX_ENTRIES} entries, not {len(networks)}; "
                         "use wider networks.")
    return ",".join(map(str, networks)) or None


def network_of(entry):
    """The network an entry means (a bare address is its /32 or /128; host bits are cleared), or None."""
    if "%" in entry:
        return None  # a zone (fe80::1%eth0) names a link of this host, never a client's address
    try:
        network = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None
    if network.version == 6 and network.subnet_of(MAPPED_IPV4):
        return ipaddress.IPv4Network((network.network_address.ipv4_mapped, network.prefixlen - 96))
    return network


@functools.lru_cache(maxsize=1024)
def networks(stored):
    """A stored allow-list ready for matching: {IP version: ((netmask, network numbers), ...)}, one
    set per prefix length, so a client costs a set lookup per distinct prefix length rather than a
    comparison per network (ipaddress's `in` takes about a microsecond each)."""
    by_version = {}
    for entry in stored.split(","):
        network = ipaddress.ip_network(entry)
        masks = by_version.setdefault(network.version, {})
        masks.setdefault(int(network.netmask), set()).add(int(network.network_address))
    return {version: tuple((mask, frozenset(numbers)) for mask, numbers in masks.items())
            for version, masks in by_version.items()}


@functools.lru_cache(maxsize=4096)
def client_ip(address):
    """A client address as an ip_address (a mapped IPv4 one as IPv4), or None when it is not one."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped:
        return ip.ipv4_mapped
    return ip


def permits(allowed, address):
    """True when the client address is in one of the allowed networks (networks' form)."""
    ip = client_ip(address or "")
    if ip is None:
        return False
    number = int(ip)
    return any(number & mask in numbers for mask, numbers in allowed.get(ip.version, ()))


def summary(stored, limit=3):
    """A short form of a stored allow-list for people: its first networks and how many more."""
    if not stored:
        return "any address"
    entries = stored.split(",")
    shown = ", ".join(entries[:limit])
    return f"{shown} and {len(entries) - limit} more" if len(entries) > limit else shown
