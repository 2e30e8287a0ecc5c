"""Usage: counting requests per key, credits, the thresholds that raise usage and credit events, the analytics
read from the counts, and the data life cycle."""
