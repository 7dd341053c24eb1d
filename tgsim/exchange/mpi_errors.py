"""The MPI exchange's errors: detected once, raised with the same message on every rank.

A failure one rank sees must reach every rank, or the others wait forever in the next collective.
The rules (tgsim/exchange/mpi.py, tgsim/exchange/mpi_pipelined.py):

  config       every rank allgathers its config dict; `config_mismatch(everyone)` is the
               RankConfigMismatchError message (or None), the same text on every rank.
  allgather    every rank parses every rank's slot (`parse_slot`, `check_scalers`, `blame_codes`),
               so all raise the same PeerPayloadError naming the first malformed sender.
  allreduce    a reduction cannot name a sender: `beyond_n` when a code sum leaves ±N.
  ps           only the server (rank 0) parses the slots. Its downlink (or each downlink piece)
               starts with a u64 status word: STATUS_OK, STATUS_PAYLOAD (a worker's payload is
               malformed: PeerPayloadError) or STATUS_SERVER (anything else: ServerError).
               `server_failure` turns the server's exception into (status, text); `write_status` /
               `read_status` put the word on the wire; after a status other than STATUS_OK every
               rank calls `raise_server_failure`, which broadcasts the server's text and raises it.
               A worker that cannot decode a downlink that arrived with STATUS_OK raises
               `malformed_downlink` (a malformed downlink comes from rank 0).
  sharded_ps   every rank is the owner (server) of one shard (tgsim/exchange/sharded.py): it
               checks the blocks of its shard and starts its block of the Allgatherv with the
               same status word (in pieces: on each sums piece it sends); after any status
               other than STATUS_OK every rank calls
               `raise_server_failure` with the lowest failed owner as root, so all raise that
               owner's text, which names the sender of the malformed block.

The error classes live in tgsim/errors.py (PeerPayloadError, ServerError and RankConfigMismatchError
are CollectiveErrors); tgsim/exchange/pieces.py's SenderError names the sender of a malformed piece.
"""

from __future__ import annotations

from typing import Iterable, NoReturn, Sequence

import numpy as np

from tgsim.backend import to_numpy
from tgsim.codecs import packing
from tgsim.codecs.message import KIND_TERNARY, Layout, Message, from_bytes
from tgsim.errors import PeerPayloadError, ServerError
from tgsim.exchange.mpi_transport import _HDR, _U64
from tgsim.exchange.pieces import SenderError

STATUS_OK, STATUS_PAYLOAD, STATUS_SERVER = 0, 1, 2   # the downlink's u64 status word
SERVER = "the parameter server (rank 0)"             # `where` of errors the server detects


# -- ranks started differently ---------------------------------------------------------------------

def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, ranks = [], sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)


def config_mismatch(everyone: Sequence[dict], keys: Iterable[str] | None = None) -> str | None:
    """The RankConfigMismatchError message for every rank's config dict (in rank order, as
    `comm.allgather` returns them), or None when they agree. `keys`: the entries compared (default
    rank 0's); a missing entry reads "?"."""
    problems = []
    for key in (everyone[0] if keys is None else keys):
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(everyone):
            groups.setdefault(d.get(key, "?"), []).append(r)
        if len(groups) > 1:
            ref = everyone[0].get(key, "?")
            parts = [f"rank{'s' if len(rs) > 1 else ''} {rank_ranges(rs)}: {v[:16]}" for v, rs in
                     sorted(groups.items(), key=lambda kv: kv[1][0])]
            odd = sorted(r for v, rs in groups.items() if v != ref for r in rs)
            problems.append(f"{key} differs from rank 0's on rank{'s' if len(odd) > 1 else ''} "
                            f"{rank_ranges(odd)} ({'; '.join(parts)})")
    if not problems:
        return None
    return (f"MPI ranks were started with different configurations ({len(everyone)} ranks): "
            + " | ".join(problems) + ". Launch every rank with the same config file, --set "
            "overrides and tgsim installation.")


# -- malformed payloads from a peer ----------------------------------------------------------------

def malformed(where: str, sender: int, detail) -> PeerPayloadError:
    """`where` (a rank, or SERVER) received a malformed payload from rank `sender`."""
    return PeerPayloadError(f"{where} received a malformed payload from rank {sender}: {detail}")


def malformed_downlink(rank: int, err: Exception) -> PeerPayloadError:
    """Rank `rank` could not decode the server's downlink (raise it `from err`)."""
    return PeerPayloadError(f"rank {rank} received a malformed downlink from rank 0: {err}")


def parse_slot(slot: np.ndarray, layout: Layout, sender: int, where: str) -> Message:
    """The Message in rank `sender`'s slot [u64 length | serialized Message] (PeerPayloadError if
    the length is not the layout's or the message does not parse against `layout`)."""
    wire = len(layout.header_bytes()) + layout.body_bytes()
    length = int(slot[:_HDR].view(_U64)[0])
    if length != wire:
        raise malformed(where, sender, f"it is {length} bytes, the model's layout needs {wire}")
    try:
        return from_bytes(memoryview(slot[_HDR:_HDR + wire]), layout)
    except ValueError as e:
        raise malformed(where, sender, e) from e


def check_scalers(messages: Sequence[Message], ref: Message, where: str) -> None:
    """With shared scalers every message carries the same (MAX-shared) scaler per ternary layer as
    `ref`: PeerPayloadError naming the first sender (rank = index) and layer that differ. Every rank
    passes the same `ref` (rank 0's message; the server's own in ps mode), so all name one sender."""
    tern = np.array([s.kind == KIND_TERNARY for s in ref.layout.layers], dtype=bool)
    for r, m in enumerate(messages):
        bad = np.flatnonzero(tern & (np.asarray(m.scalers) != np.asarray(ref.scalers)))
        if bad.size:
            i = int(bad[0])
            raise malformed(where, r, f"layer {ref.layout.layers[i].name!r} has scaler {m.scalers[i]}, "
                                      f"the shared scaler is {ref.scalers[i]}")


def blame_codes(codec, messages: Sequence[Message], where: str, err: Exception) -> PeerPayloadError:
    """After a decode kernel rejected the payloads (`err`): the error naming the first sender whose
    codes are invalid, or one without a sender when every payload checks out."""
    for r, m in enumerate(messages):
        for spec, part in zip(m.layout.layers, m.parts):
            if spec.kind != KIND_TERNARY:
                continue
            try:
                packing.check_payload(to_numpy(part), spec.size, codec.packing, where=f"layer {spec.name!r}")
            except ValueError as e:
                return malformed(where, r, e)
    return PeerPayloadError(f"{where} could not decode the payloads: {err}")


def beyond_n(rank: int, n: int) -> PeerPayloadError:
    """The integer all-reduce returned a code sum beyond ±n (no sender can be named)."""
    return PeerPayloadError(f"rank {rank}: the integer all-reduce returned a code sum beyond ±{n}: "
                            "some rank contributed invalid codes (a reduction cannot name the sender)")


# -- the server's failures, over the downlink's status word ------------------------------------------

def server_failure(err: Exception, where: str = SERVER) -> tuple[int, str]:
    """(status, text) of an exception at the server: a malformed worker payload (PeerPayloadError,
    or pieces.SenderError naming the sender) is STATUS_PAYLOAD, anything else STATUS_SERVER."""
    if isinstance(err, SenderError):
        return STATUS_PAYLOAD, str(malformed(where, err.sender, err))
    if isinstance(err, PeerPayloadError):
        return STATUS_PAYLOAD, str(err)
    return STATUS_SERVER, f"{where} failed: {type(err).__name__}: {err}"


def write_status(word: np.ndarray, status: int) -> None:
    """The status into word[:8] (uint8, little-endian u64)."""
    word[:_HDR] = np.array([status], dtype=_U64).view(np.uint8)


def read_status(word: np.ndarray) -> int:
    """The status in word[:8]."""
    return int(word[:_HDR].view(_U64)[0])


def raise_server_failure(comm, status: int, text: str | None, root: int = 0) -> NoReturn:
    """Every rank, after a status other than STATUS_OK: the server's `text` (None elsewhere),
    broadcast from `root`, raised as PeerPayloadError (STATUS_PAYLOAD) or ServerError."""
    text = comm.bcast(text, root=root)
    raise (PeerPayloadError if status == STATUS_PAYLOAD else ServerError)(text)


def raise_if_server_failed(comm, text: str | None, root: int = 0) -> None:
    """Every rank, without a status word: the server's error text or None, broadcast from `root`;
    raised as PeerPayloadError when it is not None."""
    text = comm.bcast(text, root=root)
    if text is not None:
        raise PeerPayloadError(text)


__all__ = ["SERVER", "STATUS_OK", "STATUS_PAYLOAD", "STATUS_SERVER", "beyond_n", "blame_codes", "check_scalers",
           "config_mismatch", "malformed", "malformed_downlink", "parse_slot", "raise_if_server_failed",
           "raise_server_failure", "rank_ranges", "read_status", "server_failure", "write_status"]
