"""The client address a trusted proxy forwards, kept only when it is an IP address."""

from ops import clientaddress


class CheckedClientAddress:
    """WSGI middleware, inside ProxyFix: the client address a proxy forwarded is whatever the client
    wrote when it reached the server directly. Keep it only when it is an IP address (written
    plainly, without a port or brackets); else the peer's address stands. The per-IP limits, the
    logs and the security log then only ever see addresses."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        original = environ.get("werkzeug.proxy_fix.orig", {}).get("REMOTE_ADDR")
        if environ.get("REMOTE_ADDR") != original:
            address = clientaddress.parse_address(environ.get("REMOTE_ADDR"))
            environ["REMOTE_ADDR"] = str(address) if address is not None else original
        return self.wsgi_app(environ, start_response)
