"""The MPI exchange's error rules (tgsim/exchange/mpi_errors.py) without MPI: the config-mismatch
message, malformed slots and scalers naming the sender, and the server's status word."""

import numpy as np
import pytest

import tgsim.exchange.mpi  # noqa: F401  (imported at collection: tools/mutation.py counts module-level
import tgsim.exchange.mpi_env  # noqa: F401  lines as run at import)
from tgsim.codecs import TernGrad
from tgsim.errors import CollectiveError, PeerPayloadError, RankConfigMismatchError, ServerError
from tgsim.exchange import InProcessExchange
from tgsim.exchange import mpi_errors as me
from tgsim.exchange.pieces import SenderError
from tgsim.rng import StreamKey

from fakes import ConfigComm

SHAPES = {"a": (37, 13), "bias": (13,), "b": (101,)}
TAIL = ". Launch every rank with the same config file, --set overrides and tgsim installation."


def _messages(n: int = 4, seed: int = 3):
    codec = TernGrad(min_size=5, float_layers=("bias",))
    rng = np.random.default_rng(seed)
    layers = [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(n)]
    scalings = [codec.scaling(g) for g in layers]
    shared = InProcessExchange(n).max_scalers(np.stack([codec.local_scalers(s) for s in scalings]))
    return codec, [codec.encode(layers[w], StreamKey(seed, 1, w), shared, scalings[w]) for w in range(n)]


def _slot(msg) -> np.ndarray:
    """[u64 length | serialized message], as MPIExchange._slot sends it."""
    return np.frombuffer(np.uint64(msg.wire_bytes).tobytes() + msg.to_bytes(), np.uint8).copy()


# -- config agreement ------------------------------------------------------------------------------

def test_rank_ranges():
    assert me.rank_ranges([0, 1, 2, 5]) == "0-2, 5"
    assert me.rank_ranges([5, 3, 1, 2]) == "1-3, 5"
    assert me.rank_ranges([4]) == "4" and me.rank_ranges([]) == ""


def test_identical_configs_give_none():
    mine = {"config sha256": "abc", "numpy": "2.0"}
    assert me.config_mismatch([dict(mine) for _ in range(5)]) is None
    assert me.config_mismatch([mine]) is None


def test_a_config_mismatch_names_the_rank_ranges():
    everyone = [{"config sha256": "other" if r in (1, 2, 3, 5) else "same", "numpy": "2.0"} for r in range(7)]
    assert me.config_mismatch(everyone) == (
        "MPI ranks were started with different configurations (7 ranks): config sha256 differs from rank 0's "
        "on ranks 1-3, 5 (ranks 0, 4, 6: same; ranks 1-3, 5: other)" + TAIL)


def test_a_config_mismatch_of_one_rank_and_of_two_keys():
    everyone = [{"a": "x" * 20, "b": "1"}, {"a": "x" * 20, "b": "1"}, {"a": "y" * 20}]
    assert me.config_mismatch(everyone, keys=["a", "b"]) == (
        "MPI ranks were started with different configurations (3 ranks): a differs from rank 0's on rank 2 "
        f"(ranks 0-1: {'x' * 16}; rank 2: {'y' * 16}) | b differs from rank 0's on rank 2 (ranks 0-1: 1; rank 2: ?)"
        + TAIL)


def test_check_same_config_raises_the_message_on_a_fake_comm():
    """MPIExchange.check_same_config: the allgathered dicts through config_mismatch (no MPI needed)."""
    from tgsim.exchange.mpi import MPIExchange

    ex = object.__new__(MPIExchange)
    ex.size, ex.comm = 3, ConfigComm({})
    ex.check_same_config("d1", shard_plan="p")
    ex.comm = ConfigComm({"shard plan": "q"})
    with pytest.raises(RankConfigMismatchError, match=r"^MPI ranks .* \(3 ranks\): shard plan differs from "
                                                       r"rank 0's on rank 2 \(ranks 0-1: p; rank 2: q\)\. Launch"):
        ex.check_same_config("d1", shard_plan="p")


# -- malformed payloads -------------------------------------------------------------------------------

def test_parse_slot_gives_the_message():
    _, msgs = _messages()
    got = me.parse_slot(_slot(msgs[1]), msgs[0].layout, 1, "rank 0")
    assert got.to_bytes() == msgs[1].to_bytes()


def test_a_slot_of_the_wrong_length_names_the_sender():
    _, msgs = _messages()
    slot = _slot(msgs[2])
    wire = msgs[2].wire_bytes
    slot[:8] = np.frombuffer(np.uint64(wire - 3).tobytes(), np.uint8)
    with pytest.raises(PeerPayloadError) as e:
        me.parse_slot(slot, msgs[0].layout, 2, "rank 1")
    assert str(e.value) == (f"rank 1 received a malformed payload from rank 2: it is {wire - 3} bytes, "
                            f"the model's layout needs {wire}")


def test_a_corrupted_header_names_the_sender():
    _, msgs = _messages()
    slot = _slot(msgs[3])
    slot[8:12] = np.frombuffer(b"XXXX", np.uint8)
    with pytest.raises(PeerPayloadError) as e:
        me.parse_slot(slot, msgs[0].layout, 3, me.SERVER)
    assert str(e.value) == ("the parameter server (rank 0) received a malformed payload from rank 3: "
                            "not a tgsim message (magic b'XXXX')")
    assert isinstance(e.value, CollectiveError)


def test_a_scaler_mismatch_names_the_layer_and_the_rank():
    _, msgs = _messages()
    me.check_scalers(msgs, msgs[0], "rank 0")            # shared scalers: all equal
    bad = msgs[1]
    bad.scalers[2] = np.float32(bad.scalers[2] * 2)      # layer 'b' (index 2) of rank 1
    with pytest.raises(PeerPayloadError) as e:
        me.check_scalers(msgs, msgs[0], "rank 0")
    assert str(e.value) == (f"rank 0 received a malformed payload from rank 1: layer 'b' has scaler "
                            f"{bad.scalers[2]}, the shared scaler is {msgs[0].scalers[2]}")


def test_blame_codes_names_the_first_sender_with_invalid_codes():
    codec, msgs = _messages()
    err = ValueError("kernel said no")
    assert str(me.blame_codes(codec, msgs, "rank 0", err)) == "rank 0 could not decode the payloads: kernel said no"
    slots = [_slot(m) for m in msgs]
    head = len(msgs[0].layout.header_bytes())
    slots[1][8 + head + 4] = 0xFF                        # layer 'a': scaler, then codes
    msgs = [me.parse_slot(s, msgs[0].layout, r, "rank 0") for r, s in enumerate(slots)]
    e = me.blame_codes(codec, msgs, "rank 0", err)
    assert isinstance(e, PeerPayloadError)
    assert str(e).startswith("rank 0 received a malformed payload from rank 1: layer 'a': invalid code 0b11")


def test_beyond_n():
    assert str(me.beyond_n(3, 8)) == ("rank 3: the integer all-reduce returned a code sum beyond ±8: some rank "
                                      "contributed invalid codes (a reduction cannot name the sender)")


# -- the server's status word -------------------------------------------------------------------------

def test_server_failure_status_and_text():
    assert me.server_failure(SenderError(2, "layer 'b': invalid code")) == (
        me.STATUS_PAYLOAD, "the parameter server (rank 0) received a malformed payload from rank 2: layer 'b': "
                           "invalid code")
    assert me.server_failure(PeerPayloadError("as it is")) == (me.STATUS_PAYLOAD, "as it is")
    assert me.server_failure(RuntimeError("boom")) == (
        me.STATUS_SERVER, "the parameter server (rank 0) failed: RuntimeError: boom")
    assert len({me.STATUS_OK, me.STATUS_PAYLOAD, me.STATUS_SERVER}) == 3


def test_status_word_round_trip_is_a_little_endian_u64():
    word = np.full(12, 0xAA, dtype=np.uint8)
    me.write_status(word, me.STATUS_SERVER)
    assert word[:8].tobytes() == (2).to_bytes(8, "little") and (word[8:] == 0xAA).all()
    assert me.read_status(word) == me.STATUS_SERVER
    me.write_status(word, me.STATUS_OK)
    assert me.read_status(word[:8]) == me.STATUS_OK


class _Bcast:
    """A communicator whose bcast returns the root's object (here: the text the server had)."""

    def __init__(self, text):
        self.text = text

    def bcast(self, obj, root=0):
        return self.text


@pytest.mark.parametrize("status,cls", [(me.STATUS_PAYLOAD, PeerPayloadError), (me.STATUS_SERVER, ServerError)])
def test_every_rank_raises_the_servers_text(status, cls):
    with pytest.raises(cls, match="^the server's words$") as e:
        me.raise_server_failure(_Bcast("the server's words"), status, None)
    assert type(e.value) is cls and isinstance(e.value, CollectiveError)
    me.raise_if_server_failed(_Bcast(None), None)
    with pytest.raises(PeerPayloadError, match="^the server's words$"):
        me.raise_if_server_failed(_Bcast("the server's words"), None)


def test_a_key_missing_on_rank_0_is_shown_as_a_question_mark():
    """Rank 0 without a key the others have: rank 0 shows "?", and ranks 1-2 differ from it."""
    everyone = [{"a": "1"}, {"a": "1", "b": "2"}, {"a": "1", "b": "2"}]
    msg = me.config_mismatch(everyone, keys=["a", "b"])
    assert "b differs from rank 0's on ranks 1-2 (rank 0: ?; ranks 1-2: 2)" in msg


def test_blame_codes_looks_past_a_float_layer():
    """Layers a (ternary), bias (float), b (ternary): invalid codes in b, after the float layer, are
    still found and blamed on their sender (rank 2)."""
    from tgsim.codecs import packing

    codec, msgs = _messages()
    layout = msgs[0].layout
    slots = [_slot(m) for m in msgs]
    at = 8 + len(layout.header_bytes()) + 4 + packing.packed_size(37 * 13, codec.packing) + 4 * 13 + 4
    slots[2][at] = 0xFF                                  # layer 'b': its scaler, then codes
    msgs = [me.parse_slot(s, layout, r, "rank 0") for r, s in enumerate(slots)]
    e = me.blame_codes(codec, msgs, "rank 0", ValueError("kernel said no"))
    assert str(e).startswith("rank 0 received a malformed payload from rank 2: layer 'b': invalid code 0b11")


@pytest.mark.mutation
def test_server_failure_text_is_broadcast_from_rank_0_by_default():
    """raise_server_failure and raise_if_server_failed broadcast the server's text from rank 0 (the
    parameter server) unless told another root."""
    from tgsim.errors import PeerPayloadError, ServerError
    from tgsim.exchange import mpi_errors as me

    class Comm:
        roots = []

        def bcast(self, obj, root):
            self.roots.append(root)
            return "words"

    comm = Comm()
    with pytest.raises(ServerError, match="^words$"):
        me.raise_server_failure(comm, me.STATUS_SERVER, None)
    with pytest.raises(PeerPayloadError, match="^words$"):
        me.raise_if_server_failed(comm, None)
    with pytest.raises(PeerPayloadError):
        me.raise_if_server_failed(comm, None, root=2)
    assert comm.roots == [0, 0, 2]
