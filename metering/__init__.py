"""Usage: counting requests per key, the analytics read from the counts, and the data life cycle."""
