"""Client addresses: the IP address in one as proxies write it, and the name per-IP limits give it."""

import functools
import ipaddress

UNPARSABLE_ADDRESS = "unparsable"


@functools.lru_cache(maxsize=4096)
def client_identity(address):
    """The name per-IP limits give a client address: an IPv4 client's address; an IPv6 client's
    /64 (a subscriber's usual share, whose 2^64 addresses would otherwise each get an allowance),
    or the IPv4 address inside an IPv4-mapped, 6to4 or Teredo one; anything else shares one name."""
    ip = parse_address(address)
    if ip is None:
        return UNPARSABLE_ADDRESS
    if ip.version == 4:
        return str(ip)
    inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
    return str(inner) if inner else str(ipaddress.IPv6Network((ip, 64), strict=False))


@functools.lru_cache(maxsize=4096)
def parse_address(text):
    """The IP address in a client address as proxies write it (`[v6]:port`, `v4:port`, a zone id),
    or None."""
    text = (text or "").strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
