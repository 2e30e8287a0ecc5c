"""What a keyed request needs in memory: the key cache and parsed IP allow-lists."""
