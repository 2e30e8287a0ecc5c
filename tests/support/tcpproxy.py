"""A loopback TCP forwarder whose link can be cut and restored, or stalled and resumed, to take a
database or Redis away from a running server (or make it hang) and give it back."""

import socket
import threading


class TcpProxy:
    def __init__(self, target):
        self.target = target
        self.flowing = threading.Event()
        self.flowing.set()
        self.connections = set()
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.serve()

    def serve(self):
        threading.Thread(target=self.accept, args=(self.listener,), daemon=True).start()

    def accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            with self.lock:
                self.connections.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(source, sink), daemon=True).start()

    def pump(self, source, sink):
        try:
            while data := source.recv(65536):
                self.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                self.drop(end)

    def drop(self, end):
        with self.lock:
            self.connections.discard(end)
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        end.close()

    def cut(self):
        """Refuse new connections and reset the open ones."""
        # shutdown() wakes the accept() blocked in another thread; close() alone would not.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # cut already
        self.listener.close()
        with self.lock:
            ends = list(self.connections)
        for end in ends:
            self.drop(end)

    def stall(self):
        """Keep every connection open but pass nothing on: a peer that hangs."""
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def restore(self):
        """Accept connections again, on the same port (where it was cut)."""
        if self.listener.fileno() != -1:
            return
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.serve()

    def close(self):
        self.cut()
