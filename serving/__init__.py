"""What stands between the server and the app: start-up, the envelope, the fast lane, CORS, the fallback server."""
