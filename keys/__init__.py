"""API keys: the secret's format and hash, look-ups, the key cache, IP allow-lists, the key_changed signal."""
