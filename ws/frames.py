"""The common case of a client's frames read without wsproto: whole, short, masked text messages.

wsproto parses each frame through a generator, an event object and an incremental UTF-8 decoder,
about 10 µs a message; these few lines take under 1. Anything else, or any doubt, is wsproto's:
whole_texts returns None and the read goes to wsproto as it is, which refuses what is malformed
as it always has. tests/unit/ws/test_frames.py holds it to wsproto's answers for the same bytes.
"""

# FIN set, no RSV bit, opcode 1 (text): a whole text message in one frame.
WHOLE_TEXT = 0x81
MASKED = 0x80
# A 7-bit length up to 125; 126 announces a 16-bit length, which must be over 125 (RFC 6455 5.2).
LONGEST_SHORT = 125
TWO_BYTE_LENGTH = 126


def whole_texts(data, longest):
    """The text messages in data if it is nothing but whole masked text frames of at most longest
    bytes each (and under 64 KiB) whose payloads are valid UTF-8; else None."""
    texts = []
    at, end = 0, len(data)
    while at < end:
        if end - at < 6 or data[at] != WHOLE_TEXT:
            return None
        # Over 127 where the mask bit is clear: left to wsproto below, with the 64-bit lengths.
        length = data[at + 1] ^ MASKED
        mask_at = at + 2
        if length == TWO_BYTE_LENGTH:
            if end - at < 8:
                return None
            length = int.from_bytes(data[at + 2:at + 4], "big")
            if length <= LONGEST_SHORT:
                return None
            mask_at = at + 4
        elif length > TWO_BYTE_LENGTH:
            return None
        start = mask_at + 4
        stop = start + length
        if length > longest or stop > end:
            return None
        mask = int.from_bytes(data[mask_at:start] * (length // 4 + 1), "little") & ((1 << 8 * length) - 1)
        payload = (int.from_bytes(data[start:stop], "little") ^ mask).to_bytes(length, "little")
        try:
            texts.append(payload.decode())
        except UnicodeDecodeError:
            return None
        at = stop
    return texts
