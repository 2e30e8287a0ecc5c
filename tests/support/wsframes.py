"""A client's frames built by hand, well formed or not, and hypothesis strategies of both: for the
tests that hold ws/frames.py and the reader to wsproto's reading of the same bytes."""

import os
import struct

from hypothesis import strategies as st


def frame(payload, first_byte=0x81, masked=True, length_form=None, mask=None):
    """A client's frame: first_byte (FIN, RSV, opcode), payload masked with mask (random), its length
    in the shortest form unless length_form ("7", "16", "64") says otherwise."""
    length = len(payload)
    length_form = length_form or ("7" if length <= 125 else "16" if length < 65536 else "64")
    mask_bit = 0x80 if masked else 0
    header = bytes([first_byte])
    if length_form == "7":
        header += bytes([mask_bit | length])
    elif length_form == "16":
        header += bytes([mask_bit | 126]) + struct.pack("!H", length)
    else:
        header += bytes([mask_bit | 127]) + struct.pack("!Q", length)
    if not masked:
        return header + payload
    mask = mask or os.urandom(4)
    return header + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))


texts = st.text(max_size=300)
well_formed = st.builds(lambda text: frame(text.encode()), texts)
# The frames of a message in parts: a first frame without FIN (text, binary), a continuation, a last one.
fragments = st.builds(lambda text, first: frame(text.encode(), first), st.text(max_size=100),
                      st.sampled_from([0x01, 0x02, 0x00, 0x80]))
# Each the bytes of a frame that wsproto reads otherwise: another kind of frame (binary, ping, pong,
# close), a bad length, bad UTF-8, no mask, RSV bits, or a frame cut short.
unusual = st.one_of(
    st.builds(lambda text, first: frame(text.encode(), first), st.text(max_size=100),
              st.sampled_from([0x82, 0x89, 0x8A, 0x88, 0x91, 0xA1, 0xC1, 0x83])),
    st.builds(lambda text: frame(text.encode(), masked=False), texts),
    st.builds(lambda text, form: frame(text.encode(), length_form=form), st.text(max_size=200),
              st.sampled_from(["16", "64"])),
    st.builds(lambda raw: frame(raw), st.binary(max_size=40)),
    st.builds(lambda text, cut: frame(text.encode())[:cut], texts, st.integers(0, 40)),
    st.binary(max_size=20),
)
any_frame = st.one_of(well_formed, well_formed, fragments, unusual)
streams = st.lists(any_frame, max_size=6).map(b"".join)


@st.composite
def reads(draw):
    """A client's reads, each of one to three frames, and perhaps one of them cut in two anywhere."""
    cut_stream = draw(st.lists(st.lists(any_frame, min_size=1, max_size=3).map(b"".join), max_size=5))
    if cut_stream and draw(st.booleans()):
        index = draw(st.integers(0, len(cut_stream) - 1))
        at = draw(st.integers(0, len(cut_stream[index])))
        cut_stream[index:index + 1] = [part for part in (cut_stream[index][:at], cut_stream[index][at:]) if part]
    return cut_stream
