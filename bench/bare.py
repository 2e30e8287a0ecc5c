"""The ceiling: a bare Flask endpoint and a bare flask-sock echo, served with the same gunicorn
settings as the service."""

from flask import Flask
from flask_sock import Sock

app = Flask(__name__)
sock = Sock(app)


@app.get("/bare")
def bare():
    return {"status": "ok", "authenticated": False}


@sock.route("/echo")
def echo(ws):
    while True:
        ws.send(ws.receive())
