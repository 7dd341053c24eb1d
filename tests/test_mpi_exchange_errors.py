"""tgsim/exchange/mpi.py and mpi_pipelined.py, failures: MPIExchange driven in-process by the fake
communicator of tests/fakes.py (one thread per rank). A malformed payload, a sender whose scaler is
not the shared one, a server or a worker that fails: every rank raises the same error, naming the
rank and the layer. Expected values are worked out by hand or with plain NumPy."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from tgsim.exchange.inprocess import InProcessExchange

from fakes import _aggregate_on_ranks, _terngrad, _World, run_ranks, same_bits


def _corrupt_rank(monkeypatch, rank, how):
    """Rank `rank` puts how(bytes) on the wire instead of its message's bytes (the _serialize seam)."""
    from tgsim.exchange.mpi import MPIExchange

    monkeypatch.setattr(MPIExchange, "_serialize",
                        lambda self, msg: how(msg.to_bytes()) if self.rank == rank else msg.to_bytes())


def _bad_code(msg):
    """A function that sets the first code byte of the ternary layer w (after the header and its
    f32 scaler) to 0xff: four 2-bit codes 0b11, which no valid message has."""
    at = len(msg.layout.header_bytes()) + 4

    def how(b):
        b = bytearray(b)
        b[at] = 0xFF
        return bytes(b)
    return how


def _errors(results):
    from tgsim.errors import PeerPayloadError, ServerError

    assert all(isinstance(r, (PeerPayloadError, ServerError)) for r in results), results
    return [(type(r).__name__, str(r)) for r in results]


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [-1, 0, 40])
def test_mpi_allgather_names_the_sender_of_a_short_slot_on_every_rank(monkeypatch, chunk):
    """Rank 1's slot says it is one byte short: every rank raises PeerPayloadError naming rank 1
    (each names itself as the receiver), in one piece or in several; every nonblocking send and
    receive was completed first (the communicator stays in step)."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    _corrupt_rank(monkeypatch, 1, lambda b: b[:-1])
    world = _World(3)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "allgather", True),
                            monkeypatch, chunk=chunk, world=world))
    assert all(r.waited for r in world.requests) and len(world.requests) == (0 if chunk < 0 else
                                                                              (2 + 2) * 3 * (1 if chunk == 0 else 5))
    for r, (kind, text) in enumerate(res):
        assert kind == "PeerPayloadError"
        assert text.startswith(f"rank {r} received a malformed payload from rank 1: ")
        assert f"{msgs[0].wire_bytes - 1} bytes" in text


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [-1, 40])
def test_mpi_allgather_names_the_sender_of_invalid_codes(monkeypatch, chunk):
    """Rank 2's ternary codes contain 0b11: every rank names rank 2 and the layer."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    _corrupt_rank(monkeypatch, 2, _bad_code(msgs[0]))
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "allgather", True),
                            monkeypatch, chunk=chunk))
    for r, (kind, text) in enumerate(res):
        assert kind == "PeerPayloadError" and text.startswith(f"rank {r} received a malformed payload from rank 2")
        assert "layer 'w'" in text and "0b11" in text


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [-1, 40])
def test_mpi_allgather_names_a_sender_whose_scaler_is_not_the_shared_one(monkeypatch, chunk):
    """With shared scalers, rank 1's message carries another scaler for w: every rank names rank 1
    (each checks the slots against rank 0's, so rank 1 does not name rank 0 from its own point of
    view). The same messages without sharing aggregate (each with its own scaler)."""
    from tgsim.rng import StreamKey

    codec, msgs = _terngrad(3, sizes=(130, 5))
    g = {"w": np.full(130, 0.5, np.float32), "b": np.zeros(5, np.float32)}
    msgs[1] = codec.encode(g, StreamKey(1, 0, 1), msgs[0].scalers * 2, codec.scaling(g))
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "allgather", True),
                            monkeypatch, chunk=chunk))
    for r, (kind, text) in enumerate(res):
        assert text.startswith(f"rank {r} received a malformed payload from rank 1") and "layer 'w'" in text
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "allgather", False)
    for mean, _ in _aggregate_on_ranks(monkeypatch, 3, codec, msgs, "allgather", False, chunk=chunk):
        assert same_bits(mean, want)


@pytest.mark.mutation
@pytest.mark.parametrize("transport, chunk", [("p2p", 40), ("p2p", 0), ("p2p", -1), ("collective", 0)])
@pytest.mark.parametrize("fault", ["short", "codes"])
def test_mpi_ps_server_reports_a_malformed_slot_to_every_rank(monkeypatch, transport, chunk, fault):
    """The server finds rank 1's slot short or its codes invalid: the status word tells every rank,
    which all raise the server's PeerPayloadError naming rank 1; every nonblocking transfer was
    completed first."""
    codec, msgs = _terngrad(3, sizes=(130, 5))
    _corrupt_rank(monkeypatch, 1, (lambda b: b[:-1]) if fault == "short" else _bad_code(msgs[0]))
    world = _World(3)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                            chunk=chunk, ps_transport=transport, world=world))
    assert all(r.waited for r in world.requests)     # every piece still went both ways
    assert len(set(res)) == 1
    kind, text = res[0]
    assert kind == "PeerPayloadError"
    assert text.startswith("the parameter server (rank 0) received a malformed payload from rank 1")


@pytest.mark.mutation
def test_mpi_ps_server_failure_is_a_server_error_on_every_rank(monkeypatch):
    """Anything else failing at the server (here the downlink builder) is a ServerError with the
    same text on every rank."""
    import tgsim.exchange.mpi as mpi_mod

    codec, msgs = _terngrad(3)

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(mpi_mod, "ps_downlink", boom)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                            chunk=-1))
    assert set(res) == {("ServerError", "the parameter server (rank 0) failed: RuntimeError: boom")}


@pytest.mark.mutation
@pytest.mark.parametrize("chunk", [-1, 40])
def test_mpi_ps_worker_that_cannot_decode_the_downlink(monkeypatch, chunk):
    """The downlink to rank 2 is damaged on the wire (w's f32 scaler, right after the u64 status,
    becomes NaN; in pieces, piece 1 also carries a code sum beyond N) while its status says OK:
    rank 2 raises PeerPayloadError for a malformed downlink from rank 0, the first fault found (it
    decodes no further); ranks 0 and 1 get the in-process bits."""
    from tgsim.exchange.mpi_transport import _TAG_PS_DOWN

    codec, msgs = _terngrad(3, sizes=(130, 5))
    want, _ = InProcessExchange(3).aggregate(codec, msgs, "ps", True)

    seen = []

    def tamper(key, data):
        if key != (0, 2, _TAG_PS_DOWN):
            return data
        seen.append(data.size)
        data = data.copy()
        if len(seen) == 1:      # piece 0 (or the whole downlink): w's scaler
            data[8:12] = np.array([np.nan], np.float32).view(np.uint8)
        elif len(seen) == 2:    # piece 1 (w[40:80] at 3 bits): a packed value 7 > 2N, also malformed
            data[8] = 0xFF
        return data

    res = run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                    world=_World(3, tamper), chunk=chunk)
    assert same_bits(res[0][0], want) and same_bits(res[1][0], want)
    kind, text = _errors([res[2]])[0]
    assert kind == "PeerPayloadError" and text.startswith("rank 2 received a malformed downlink from rank 0: ")
    assert "invalid scaler nan" in text
    assert len(seen) == (1 if chunk < 0 else 5)


@pytest.mark.mutation
def test_mpi_pipelined_ps_server_failing_to_encode_its_own_piece(monkeypatch):
    """Deferred messages: the server's own piece 1 fails to encode; it still takes every piece and
    answers every piece with the error status, and every rank raises the same ServerError."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange.pieces import PiecePlan

    codec = TernGrad(clip="none", min_size=10)
    rng = np.random.default_rng(3)
    layers = {"w": rng.standard_normal((3, 130)).astype(np.float32), "b": rng.standard_normal((3, 5)).astype(np.float32)}
    sc = np.max(np.stack([m.scalers for m in codec.encode_many(layers, 1, 0, np.arange(3))]), axis=0)
    lazy = codec.encode_many(layers, 1, 0, np.arange(3), sc, deferred=True)
    fill = PiecePlan.fill_slot

    def failing(self, k, msg, slot):
        if msg is lazy[0] and k == 1:
            raise RuntimeError("encode failed")
        return fill(self, k, msg, slot)

    monkeypatch.setattr(PiecePlan, "fill_slot", failing)
    world = _World(3)
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [lazy[ex.rank]], "ps", True), monkeypatch,
                            world=world, chunk=40))
    assert set(res) == {("ServerError", "the parameter server (rank 0) failed: RuntimeError: encode failed")}
    # 5 pieces (w: 40 + 40 + 40 + 10, then b): each worker sends 5, the server answers 5 to each
    assert sum(1 for r, m in world.log if r == 0 and m == "Isend") == 2 * 5
    assert sum(1 for r, m in world.log if r == 1 and m == "Isend") == 5


@pytest.mark.mutation
def test_mpi_own_message_malformed_at_the_server(monkeypatch):
    """ps with an own-wire codec (fp16): rank 1's message arrives one byte short; the server's error
    reaches every rank as the same PeerPayloadError naming rank 1."""
    from tgsim.codecs.fp16 import Float16

    codec = Float16()
    msgs = codec.encode_many({"w": np.ones((2, 4), np.float32)}, 1, 0, np.arange(2))

    class Short(type(msgs[1])):
        def to_bytes(self):
            return super().to_bytes()[:-1]

    bad = copy.copy(msgs[1])
    object.__setattr__(bad, "__class__", Short)
    res = _errors(run_ranks(2, lambda ex: ex.aggregate(codec, [[msgs[0], bad][ex.rank]], "ps", False), monkeypatch))
    assert len(set(res)) == 1 and res[0][0] == "PeerPayloadError"
    assert res[0][1].startswith("rank 0 received a malformed message from rank 1: ")


@pytest.mark.mutation
def test_mpi_ps_server_downlink_of_the_wrong_size_is_a_server_error(monkeypatch):
    """A downlink one byte shorter than ps_downlink_size (N = 2: ceil(log2 5) = 3 bits; w 13 and b 5:
    4 + ceil(13 x 3 / 8) + 20 = 29 bytes) is the server's own failure: ServerError on every rank."""
    import tgsim.exchange.mpi as mpi_mod

    codec, msgs = _terngrad(2)
    real = mpi_mod.ps_downlink
    monkeypatch.setattr(mpi_mod, "ps_downlink", lambda *a, **k: real(*a, **k)[:-1])
    res = _errors(run_ranks(2, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch, chunk=-1))
    assert set(res) == {("ServerError", "the parameter server (rank 0) failed: RuntimeError: downlink is 28 "
                                        "bytes, expected 29")}


@pytest.mark.mutation
def test_mpi_check_same_config_names_each_entry():
    """The entries every rank compares, by name: a rank 2 that differs in config digest, tgsim
    version, message version and NumPy is named for each; a rank without a shard plan shows "-"."""
    from tgsim.errors import RankConfigMismatchError
    from fakes import ConfigComm
    from tgsim.exchange.mpi import MPIExchange

    ex = object.__new__(MPIExchange)
    ex.size = 3
    keys = ("config sha256", "tgsim", "codec message version", "numpy")
    ex.comm = ConfigComm({k: "other" for k in keys})
    with pytest.raises(RankConfigMismatchError) as e:
        ex.check_same_config("d1")
    for k in keys:
        assert f"{k} differs from rank 0's on rank 2 (ranks 0-1: " in str(e.value)
    ex.comm = ConfigComm({"shard plan": "p"})
    with pytest.raises(RankConfigMismatchError, match=r"shard plan differs from rank 0's on rank 2 \(ranks 0-1: -; "
                                                       r"rank 2: p\)"):
        ex.check_same_config("d1")


@pytest.mark.mutation
@pytest.mark.parametrize("transport, chunk", [("collective", 0), ("p2p", -1), ("p2p", 40)])
def test_mpi_ps_server_names_a_sender_whose_scaler_is_not_the_shared_one(monkeypatch, transport, chunk):
    """The parameter server checks every slot's scalers against its own (shared) ones: rank 2's
    message with another scaler for w is named on every rank."""
    from tgsim.rng import StreamKey

    codec, msgs = _terngrad(3, sizes=(130, 5))
    g = {"w": np.full(130, 0.5, np.float32), "b": np.zeros(5, np.float32)}
    msgs[2] = codec.encode(g, StreamKey(1, 0, 2), msgs[0].scalers * 2, codec.scaling(g))
    res = _errors(run_ranks(3, lambda ex: ex.aggregate(codec, [msgs[ex.rank]], "ps", True), monkeypatch,
                            chunk=chunk, ps_transport=transport))
    assert len(set(res)) == 1
    assert res[0][1].startswith("the parameter server (rank 0) received a malformed payload from rank 2: ")
    assert "layer 'w'" in res[0][1]
