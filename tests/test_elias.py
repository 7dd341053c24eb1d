"""tgsim/codecs/elias.py: the Elias-gamma coding of QSGD levels and its error reports, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tgsim.codecs import elias
from tgsim.errors import PayloadError


@pytest.mark.mutation
def test_elias_max_run_and_max_code_bits_by_hand():
    """max_run(s) = floor(log2(s + 1)): s = 0 -> 0, 1 -> 1, 2 -> 1, 3 -> 2, 6 -> 2, 7 -> 3, 15 -> 4.
    max_code_bits(s) = 2 max_run(s) + 2, except 1 for s = 0 (level 0 is the single bit '1'):
    s = 0 -> 1, 1 -> 4 ('010' + sign), 2 -> 4, 3 -> 6 ('00100' + sign), 7 -> 8."""
    assert [elias.max_run(s) for s in (0, 1, 2, 3, 6, 7, 15)] == [0, 1, 1, 2, 2, 3, 4]
    assert [elias.max_code_bits(s) for s in (0, 1, 2, 3, 7)] == [1, 4, 4, 6, 8]


@pytest.mark.mutation
@pytest.mark.parametrize("decode", [elias.decode_array, elias.decode])
def test_elias_big_level_is_reported_as_big_level_not_bad_run(decode):
    """s = 1 (longest zero run 1). Level 2 = gamma(3) = '011' then sign '0': the 4-bit stream
    0110 (byte 0x60). Its run (1) is allowed, its level 2 > s: the BIG_LEVEL message, not the
    BAD_RUN one (the two status codes must differ)."""
    buf = np.array([0x60], np.uint8)
    with pytest.raises(PayloadError, match=r"^x: element 0: Elias-gamma code at bit 0 gives a level above s = 1$"):
        decode(buf, 4, 1, 1, "x")


@pytest.mark.mutation
@pytest.mark.parametrize("decode", [elias.decode_array, elias.decode])
def test_elias_bad_run_message(decode):
    """s = 1: the stream 00 1 ... starts with 2 zeros > max_run(1) = 1: BAD_RUN, naming 1 zero
    allowed and levels <= 1. Stream 0010 0000 (byte 0x20), 8 bits, 1 element."""
    buf = np.array([0x20], np.uint8)
    with pytest.raises(PayloadError, match=r"^x: element 0: Elias-gamma code at bit 0 starts with more than 1 zeros \(levels <= 1\)$"):
        decode(buf, 8, 1, 1, "x")


@pytest.mark.mutation
@pytest.mark.parametrize("decode", [elias.decode_array, elias.decode])
def test_elias_stream_ending_inside_value_bits_is_truncated(decode):
    """s = 4 (longest run 2, largest x = 5). The 4-bit stream 0011 (byte 0x30): run 2, then the
    value bits '11' and the stream ends: the code (5 or 6 bits) is cut short -> TRUNCATED. Reading
    the missing bit as 0 would give x = 110b = 6 > 5 and a wrong 'level above s' message."""
    buf = np.array([0x30], np.uint8)
    with pytest.raises(PayloadError, match=r"^x: element 0 of 1: the 4-bit stream ends inside its code \(which starts at bit 0\)$"):
        decode(buf, 4, 1, 4, "x")


@pytest.mark.mutation
def test_elias_encode_array_by_hand():
    """Levels [0, 1, -1, 2, -3]: '1' | '010'+'0' | '010'+'1' | '011'+'0' | '00100'+'1' =
    1 0100 0101 0110 001001: 19 bits, bytes 1010 0010 | 1011 0001 | 001(0 0000) = 0xA2 0xB1 0x20."""
    q = np.array([0, 1, -1, 2, -3], np.int32)
    for enc in (elias.encode_array, elias.encode):
        buf, nbits = enc(q)
        assert nbits == 19 and buf.tolist() == [0xA2, 0xB1, 0x20]
    for dec in (elias.decode_array, elias.decode):
        assert dec(np.array([0xA2, 0xB1, 0x20], np.uint8), 19, 5, 3).tolist() == [0, 1, -1, 2, -3]


@pytest.mark.mutation
@pytest.mark.parametrize("decode", [elias.decode_array, elias.decode])
def test_elias_extra_bits_message_is_not_the_truncated_one(decode):
    """Stream '1' '1' (two level-0 codes, 2 bits, byte 0xC0) read as n = 1 element: 1 bit is left
    after element 0, which ends at bit 1: the EXTRA_BITS message (its status must differ from
    TRUNCATED's, or _error would word it as a truncation)."""
    buf = np.array([0xC0], np.uint8)
    with pytest.raises(PayloadError, match=r"^x: 1 bits left after the last of 1 elements \(which ends at bit 1\)$"):
        decode(buf, 2, 1, 3, "x")
