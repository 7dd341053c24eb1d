"""QSGD's paper coding (tgsim/codecs/qsgd_paper_coding.py; Alistarh et al. 2017, §3.2, Theorem 3.2):
the Elias omega code, exact round trips in both implementations (Numba and array code, bit for bit
and error for error), malformed streams and messages, and the expected bits against Theorem 3.2's
bound (with the old "elias" coding as the positive control).

The bound check is statistical: Theorem 3.2 bounds the expectation, and the test compares the mean
over the seeded draws SEEDS (vector seed = quantization key seed) with the bound, without slack.
That decision is stricter than a one-sided z-test of H0: E[bits] <= bound at alpha = 1e-3 (which
would accept a mean up to 3.09 standard errors above the bound). Why it does not fail wrongly for a
correct coder: over 40 draws (seeds 0..39) one draw's bits spread by 14 % of the mean at d = 1e3,
s = 1 down to 1.3 % at d = 1e5, s = 16, and the 5-draw mean lies 5.3 (d = 1e3, s = 1) to 118
standard errors below the bound: a false failure has probability < 1e-7 per (d, s). The margin
(mean / bound 0.47-0.81, test_theorem_3_2_table) comes from the theorem's worst case: it counts
s (s + sqrt d) nonzeros, a Gaussian vector has about s sqrt(2 d / pi) (E Σ x_i = s ||v||_1 / ||v||_2),
and the constants 3 and 1.5 cover the Elias codes' worst lengths. Positive control: the old "elias"
coding spends at least one bit per element and fails the same check wherever d exceeds the bound.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from numba import njit

from tgsim.codecs import qsgd_paper_coding as paper
from tgsim.codecs.qsgd import CODINGS, QSGD, QSGDMessage
from tgsim.errors import PayloadError

SEEDS = (0, 1, 2, 3, 4)
DIMS = (1_000, 100_000)
LEVELS = (1, 2, 4, 16)


def bits_of(stream: str) -> tuple[np.ndarray, int]:
    """(bytes, nbits) of a string of 0/1 (spaces ignored), zero-padded."""
    b = np.array([int(c) for c in stream.replace(" ", "")], np.uint8)
    return np.packbits(b), int(b.size)


def both_decode(buf, nbits, n, s):
    """('ok', levels) or ('error', message) from the Numba decoder; asserts the array decoder agrees."""
    out = []
    for dec in (paper.decode, paper.decode_array):
        try:
            out.append(("ok", dec(buf, nbits, n, s).tolist()))
        except PayloadError as err:
            out.append(("error", str(err)))
    assert out[0] == out[1], out
    return out[0]


# -- the code ---------------------------------------------------------------------------------------

def test_omega_codes_and_a_known_stream():
    """omega(1) = 0, omega(2) = 10 0, omega(3) = 11 0, omega(4) = 10 100 0, omega(17) = 10 100 10001 0;
    q = [0, 0, 1, 0, -3]: gap 3, +, level 1, then gap 2, -, level 3."""
    for k, code in ((1, "0"), (2, "100"), (3, "110"), (4, "101000"), (17, "10100100010"),
                    (1000, "11 1001 1111101000 0")):
        code = code.replace(" ", "")
        assert paper.omega_bits(k) == len(code)
        q = np.zeros(k, np.int8)
        q[-1] = 1                                      # one nonzero at element k - 1: gap k, +, level 1
        want = bits_of(code + "0" + "0")
        for enc in (paper.encode, paper.encode_array):
            buf, nbits = enc(q)
            assert nbits == want[1] and buf.tobytes() == want[0].tobytes(), (k, enc)
    want = bits_of("110 0 0" + "100 1 110")
    for enc in (paper.encode, paper.encode_array):
        buf, nbits = enc(np.array([0, 0, 1, 0, -3], np.int16))
        assert (buf.tobytes(), nbits) == (want[0].tobytes(), want[1]) == (bytes([0b11000100, 0b11100000]), 12)


def test_omega_length_bound_holds_at_every_power_of_two():
    """h(x) = 1 + log2 x + 3 log2(1 + log2 x) >= |omega(k)| on [2^j, 2^(j+1)) for j < 63: |omega| is
    constant there (checked at both ends) and h increasing, so h(2^j) >= |omega(2^j)| is the case."""
    for j in range(63):
        assert paper.omega_bits(2**j) == paper.omega_bits(2 ** (j + 1) - 1)
        assert paper.omega_bits_bound(2.0**j) >= paper.omega_bits(2**j), j


def omega_string(k: int) -> str:
    """omega(k) as a 0/1 string, from its definition (module docstring of qsgd_paper_coding)."""
    code = "0"
    while k > 1:
        code = format(k, "b") + code
        k = k.bit_length() - 1
    return code


@njit
def _numba_omega(k):
    out = np.zeros(16, np.uint8)
    acc, nacc, pos = paper._push_omega(out, np.uint64(0), 0, 0, k, np.empty(8, np.int64))
    if nacc > 0:
        out[pos] = np.uint8((acc << np.uint64(8 - nacc)) & np.uint64(0xFF))
    return out, 8 * pos + nacc


def test_numba_omega_of_values_beyond_32_bits():
    """The Numba encoder writes groups wider than 32 bits in two pieces: omega(k) for k from 2^31
    to 2^63 - 1 (gaps of layers beyond 2^32 elements, which no test can allocate) equals the
    definition, and every k of 1..4096 too."""
    for k in list(range(1, 4097)) + [2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3, 2**62 + 1, 2**63 - 1]:
        want = omega_string(k)
        buf, nbits = _numba_omega(np.int64(k))
        assert nbits == len(want) == paper.omega_bits(k), k
        assert "".join(map(str, np.unpackbits(buf)[:nbits])) == want, k


EDGE = [
    ("empty", np.zeros(0, np.int8), 1),
    ("all zero", np.zeros(37, np.int8), 1),
    ("first element", np.array([-1] + [0] * 9, np.int8), 1),
    ("last element", np.array([0] * 9 + [2], np.int8), 2),
    ("every element at s", np.array([7, -7] * 20, np.int8), 7),
    ("s = 65535", np.array([0, 65535, -65535, 1, 0, 0, -32768], np.int32), 65535),
    ("long gap", np.eye(1, 300_001, 300_000, dtype=np.int16).reshape(-1) * -3, 3),
]


@pytest.mark.parametrize("name,q,s", EDGE, ids=[e[0] for e in EDGE])
def test_round_trip_edge_cases(name, q, s):
    a, na = paper.encode(q)
    b, nb = paper.encode_array(q)
    assert na == nb and a.tobytes() == b.tobytes()
    assert na <= paper.max_bits(q.size, s)
    assert both_decode(a, na, q.size, s) == ("ok", q.astype(np.int64).tolist())


def test_random_round_trips_and_corruptions_agree_in_both_decoders():
    """300 random level vectors (seed 11; densities 0..1, s from 1 to 65535): both encoders give the
    same bytes, both decoders the levels; every single-bit flip tried (5 per vector) and every
    truncation by 1 or 3 bits gives the same levels or the same PayloadError in both decoders."""
    rng = np.random.default_rng(11)
    errors = set()
    for _ in range(300):
        n = int(rng.integers(0, 400))
        s = int(rng.choice([1, 2, 7, 100, 65535]))
        q = (rng.integers(-s, s + 1, n) * (rng.random(n) < rng.random())).astype(np.int32)
        a, na = paper.encode(q)
        b, nb = paper.encode_array(q)
        assert na == nb and a.tobytes() == b.tobytes()
        assert both_decode(a, na, n, s) == ("ok", q.tolist())
        if na == 0:
            continue
        for i in rng.integers(0, na, 5):
            c = a.copy()
            c[i >> 3] ^= np.uint8(1 << (7 - (i & 7)))
            kind, got = both_decode(c, na, n, s)
            errors.add(re.sub(r"\d+", "#", got) if kind == "error" else "ok")
        for cut in (1, 3):
            m = max(0, na - cut)
            both_decode(np.packbits(np.unpackbits(a)[:m]), m, n, s)
    # the flips reach every kind of error (and some decode to other levels)
    assert any("gap above" in e for e in errors) and any("beyond the layer" in e for e in errors)
    assert any("level above s" in e for e in errors) and any("ends inside" in e for e in errors)
    assert "ok" in errors


BAD_STREAMS = [
    # (name, stream, n, s, message)
    ("gap beyond the layer", "0 0 0 110 0 0", 3, 7,
     "nonzero 1 (code at bit 3) lands on element 3, beyond the layer's 3 elements"),
    ("gap code above n", "1110000 0 0", 3, 7,
     "nonzero 0: the gap code at bit 0 gives a gap above the layer's 3 elements"),
    ("second nonzero beyond", "100 0 0 110 1 0", 4, 7, "nonzero 1 (code at bit 5) lands on element 4"),
    ("level above s", "0 0 101000", 3, 3,
     "nonzero 0 (code at bit 0, element 0): its level code gives a level above s = 3"),
    ("level code too long", "0 1 1110000", 3, 3, "its level code gives a level above s = 3"),
    ("ends in the gap", "10", 3, 7, "nonzero 0: the 2-bit stream ends inside its code (which starts at bit 0)"),
    ("ends before the sign", "0 0 0 100", 3, 7,
     "nonzero 1: the 6-bit stream ends inside its code (which starts at bit 3)"),
    ("ends in the level", "0 1 10", 3, 7, "nonzero 0: the 4-bit stream ends inside its code"),
    ("stream for an empty layer", "0 0 0", 0, 7,
     "nonzero 0: the gap code at bit 0 gives a gap above the layer's 0 elements"),
]


@pytest.mark.parametrize("name,stream,n,s,says", BAD_STREAMS, ids=[c[0] for c in BAD_STREAMS])
def test_bad_streams_raise_the_same_payload_error_in_both_decoders(name, stream, n, s, says):
    buf, nbits = bits_of(stream)
    kind, msg = both_decode(buf, nbits, n, s)
    assert kind == "error" and says in msg, msg


def test_padding_and_byte_count_are_checked():
    buf, nbits = bits_of("0 0 0")                     # element 0 = +1, 3 bits, 5 bits of padding
    assert both_decode(buf, nbits, 2, 1) == ("ok", [1, 0])
    bad = buf.copy()
    bad[0] |= 1
    for dec in (paper.decode, paper.decode_array):
        with pytest.raises(PayloadError, match="non-zero padding bits after bit 3"):
            dec(bad, nbits, 2, 1)
        with pytest.raises(PayloadError, match="2 payload bytes for 3 bits"):
            dec(np.zeros(2, np.uint8), nbits, 2, 1)


# -- the codec --------------------------------------------------------------------------------------

def message(codec: QSGD, v: np.ndarray, seed: int = 5) -> QSGDMessage:
    layers = {"g": v[None]}
    codec.prepare_many(layers)
    return codec.encode_many(layers, seed, 0, [0])[0]


def test_paper_is_the_default_coding_and_round_trips_through_the_wire():
    """QSGD() codes "paper" (wire id 2, after "fixed" 0 and "elias" 1); numba and reference kernels
    send the same bytes, which are the array encoder's stream; from_bytes gives back the levels."""
    assert QSGD().coding == "paper" and CODINGS.index("paper") == 2
    rng = np.random.default_rng(8)
    layers = {"a": rng.standard_t(3, (3, 17, 31)).astype(np.float32), "z": np.zeros((3, 9), np.float32),
              "e": np.zeros((3, 0), np.float32), "b": rng.standard_normal((3, 40_000)).astype(np.float32)}
    for levels, bucket, norm in ((7, 512, "l2"), (1, 0, "l2"), (300, 64, "max")):
        msgs = {}
        for kern in ("numba", "reference"):
            codec = QSGD(levels=levels, bucket=bucket, norm=norm, kernels=kern)
            msgs[kern] = codec.encode_many(layers, 3, 1, [0, 1, 2])
        for a, b in zip(msgs["numba"], msgs["reference"]):
            assert a.to_bytes() == b.to_bytes() and a.params[3] == 2
            for k in layers:
                assert paper.encode_array(a.levels[k])[0].tobytes() == a.payload[k].tobytes()
            back = codec.from_bytes(a.to_bytes(), a)
            assert all(np.array_equal(back.levels[k], a.levels[k]) for k in layers)
            assert len(a.to_bytes()) == a.wire_bytes


def test_malformed_paper_messages_raise_payload_error():
    v = np.random.default_rng(1).standard_t(3, 20).astype(np.float32)
    v[:8] = 0.0
    codec = QSGD(levels=5, bucket=8)
    m = message(codec, v)
    most = paper.max_bits(20, 5)
    cases = [
        (dict(nbits=most + 1), f"{most + 1} payload bits, more than 20 elements can take ({most} bits at most)"),
        (dict(nbits=m.nbits["g"] + 8), "layer 'g': truncated"),
        (dict(payload=bits_of("0 0 0")[0], nbits=3), "element 0 has level 1 in a bucket of norm 0"),
        (dict(payload=bits_of("10100100010 0 0 101000 0 0")[0], nbits=21),
         "nonzero 1 (code at bit 13) lands on element 20, beyond the layer's 20 elements"),
        (dict(payload=bits_of("10101100000 0 0 0")[0], nbits=14), "gap code at bit 0 gives a gap above the layer's 20"),
    ]
    for fields, says in cases:
        bad = QSGDMessage(m.params, m.shapes, m.norms, m.levels, {"g": fields.get("payload", m.payload["g"])},
                          {"g": fields["nbits"]})
        with pytest.raises(PayloadError, match=re.escape(says)):
            codec.from_bytes(bad.to_bytes(), m)
    with pytest.raises(PayloadError, match="coding='paper'; this codec has levels=5, bucket=8, norm='l2', "
                                           "coding='elias'"):
        QSGD(levels=5, bucket=8, coding="elias").from_bytes(m.to_bytes(), m)


# -- bits: Theorem 3.2 ------------------------------------------------------------------------------

def coded_bits(coding: str, d: int, s: int, seed: int) -> int:
    """The paper's message of one Gaussian vector (seed `seed`, quantization key (seed, 0, 0, 0)) at
    s levels, one l2 bucket: the 32-bit norm plus the payload's bits (with its byte padding; tgsim's
    frame around it is not part of the paper's code)."""
    v = np.random.default_rng(seed).standard_normal(d).astype(np.float32)
    m = message(QSGD(levels=s, bucket=0, coding=coding), v, seed=seed)
    return 32 * int(m.norms["g"].size) + 8 * int(m.payload["g"].size)


@functools.lru_cache(maxsize=None)
def mean_bits(coding: str, d: int, s: int) -> float:
    return float(np.mean([coded_bits(coding, d, s, seed) for seed in SEEDS]))


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("s", LEVELS)
def test_paper_coding_is_under_theorem_3_2(d, s):
    """Mean over SEEDS of the paper coding's bits <= Theorem 3.2's bound (module docstring: why no
    slack is needed)."""
    bound = paper.theorem_3_2_bits(d, s)
    got = mean_bits("paper", d, s)
    assert got <= bound, (d, s, got, bound)


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("s", (1, 2))
def test_positive_control_elias_coding_exceeds_theorem_3_2(d, s):
    """The old "elias" coding spends >= 1 bit on every element, d bits > the bound where
    s (s + sqrt d) is small against d: the check of test_paper_coding_is_under_theorem_3_2 fails
    for it at these (d, s) (and at d = 1e5 for every s of LEVELS; test_theorem_3_2_table lists all)."""
    bound = paper.theorem_3_2_bits(d, s)
    assert d > bound
    assert not mean_bits("elias", d, s) <= bound


def test_theorem_3_2_table(capsys):
    """The table of the report: d, s, bound, paper (mean over SEEDS), elias (mean), fixed; paper <=
    bound everywhere, elias > bound at d = 1e5 (d bits at least), fixed = 32 + d (1 + bits(s))."""
    rows = []
    for d in DIMS:
        for s in LEVELS:
            bound = paper.theorem_3_2_bits(d, s)
            p, e, f = (mean_bits(c, d, s) for c in ("paper", "elias", "fixed"))
            rows.append((d, s, bound, p, e, f))
            assert p <= bound and f == 32 + 8 * -(-d * (s.bit_length() + 1) // 8)
            if d == 100_000:
                assert e > bound
    with capsys.disabled():
        print("\n     d   s      bound      paper      elias      fixed   paper/bound")
        for d, s, bound, p, e, f in rows:
            print(f"{d:>6} {s:>3} {bound:>10.0f} {p:>10.1f} {e:>10.1f} {f:>10.0f}   {p / bound:.3f}")


def test_bits_per_element_bounds_real_payloads():
    """bits_per_element of "paper" (frame included): the mean wire bits of 20 draws (key seed 31,
    layer seed n) of Gaussian layers <= "up" (its bound on the expectation), every draw <= "up_max"
    (every element at the longest codes); l2 and max norms, buckets of 512 and whole layers, s = 1,
    7, 16; and an all-nonzero layer (max norm, |v_i| equal: every level s) <= "up_max"."""
    for norm, bucket, s in (("l2", 512, 7), ("max", 512, 7), ("l2", 0, 7), ("l2", 0, 1), ("max", 64, 16)):
        codec = QSGD(levels=s, bucket=bucket, norm=norm)
        for n in (513, 4097, 65_536):
            g = np.random.default_rng(n).standard_normal((20, n)).astype(np.float32)
            msgs = codec.encode_many({"g": g}, 31, 0, np.arange(20))
            got = np.array([8 * m.wire_bytes for m in msgs])
            bits = codec.link_bits(n, 4)
            assert got.max() <= bits["up_max"] * n and got.mean() <= bits["up"] * n, (norm, bucket, s, n)
    codec = QSGD(levels=7, bucket=8, norm="max")
    n = 4097
    m = message(codec, np.where(np.arange(n) % 2, 1.5, -1.5).astype(np.float32))
    assert 8 * m.wire_bytes <= codec.link_bits(n, 4)["up_max"] * n
    assert codec.link_bits(0, 4) == {"up": 0.0, "up_max": 0.0, "down": 32}


def test_bits_per_element_of_the_paper_coding_at_odd_lengths_by_hand():
    """bits_per_element and link_bits' "up_max" of coding "paper" (s = 7, buckets of 512: one norm per
    layer), counted by hand from the documented format. Each element costs at most omega(gap) + sign +
    omega(level), gap <= n, level <= 7:
      omega(17) = 10 100 10001 0: 11 bits;  omega(3) = 11 0: 3 bits;  omega(7) = 10 111 0: 6 bits.
      n = 17: 17 (11 + 1 + 6) = 306 bits -> 39 bytes (38.25 rounded up)
      n = 3:   3 (3 + 1 + 6)  =  30 bits ->  4 bytes (3.75 rounded up)
    Per layer: 8 (u64 bit length) + 4 (one float32 norm) + payload; per message: frame header 21
    (<4sBIIQ) + parameters 10 (<IIBB).
      {"g": (17,)}:            21 + 10 + (8 + 4 + 39)            = 82 bytes -> 656 / 17 = 38.588 bits
      {"a": (17,), "b": (3,)}: 21 + 10 + (8 + 4 + 39) + (8 + 4 + 4) = 98 bytes -> 784 / 20 = 39.2 bits
    (Bytes rounded down would give 81 -> 38.12 and 96 -> 38.4.)"""
    codec = QSGD(levels=7, bucket=512, norm="l2", coding="paper")
    assert paper.omega_bits(17) == 11 and paper.omega_bits(3) == 3 and paper.omega_bits(7) == 6
    assert codec.bits_per_element({"g": (17,)}) == 8 * 82 / 17
    assert codec.bits_per_element({"a": (17,), "b": (3,)}) == 8 * 98 / 20
    assert codec.link_bits(17, 4)["up_max"] == 8 * 82 / 17
