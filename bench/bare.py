"""The ceiling: a bare Flask endpoint served with the same gunicorn settings as the service."""

from flask import Flask

app = Flask(__name__)


@app.get("/bare")
def bare():
    return {"status": "ok", "authenticated": False}
