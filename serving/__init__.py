"""What stands between the server and the app: start-up, the heap made ready to serve, the envelope,
the fast lane, the body limit, CORS, the app's Flask class, the forwarded client address, the fallback server."""
