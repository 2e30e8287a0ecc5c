"""The WebSocket server adapter (simple-websocket's reader and writer) and its outbox."""
