"""Check an MPI installation: every exchange mode gives the in-process exchange's bits.

    mpiexec -n 4 python -m tgsim.mpi_runs.selftest              # NumPy buffers
    mpiexec -n 4 python -m tgsim.mpi_runs.selftest --gpu        # CuPy buffers (CUDA-aware MPI or pinned staging)
    mpiexec -n 4 python -m tgsim.mpi_runs.selftest --faults     # also: malformed payloads, config mismatch

Every rank builds the gradients of all N workers from one seed (awkward values: magnitudes over
12 decades, exact zeros, -0.0, empty and scalar layers, sizes not divisible by N), computes the
reference with `InProcessExchange(N)`, runs the MPI exchange with its own worker, and compares the
bits. Rank 0 prints one line per failure and `selftest OK: ...` or `selftest FAILED: ...`; the exit
status is 0 or 1 on every rank. `--dump DIR` writes each rank's MPI results as npz (for a parent
process to compare on its own).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SEED = 20170517
SHAPES = {"conv.w": (37, 13), "conv.b": (13,), "scalar": (), "empty": (0,), "fc.w": (1001,),
          "tiny": (3,), "zeros": (50,)}
TERNARY_HINT = ("conv.w", "fc.w", "zeros")    # ternary in the TernGrad cases; the others stay float


def make_layers(n_workers: int, seed: int = SEED, dtype=np.float32, easy: tuple = ()) -> list[dict]:
    """N workers' gradients whose float64 sums depend on the order of summation (layers in `easy`:
    magnitudes 1e-6..1e6 only, for the ternary layers of the TernGrad cases)."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(n_workers):
        lay = {}
        for name, shape in SHAPES.items():
            spread = 6 if name in easy else 18
            g = np.asarray(rng.standard_normal(shape) * 10.0 ** rng.uniform(-spread, spread, shape))
            if g.size > 2 and spread > 6 and w < 2:   # +1e18 (worker 0) and -1e18 (worker 1) swallow the
                g.reshape(-1)[1::2] = 1e18 * (1.0 - 2 * w)  # other workers' values unless summed in order
            if name == "zeros":
                g = np.zeros(shape) * (-1.0 if w % 2 else 1.0)    # -0.0 on odd workers
            elif g.size > 4:
                flat = g.reshape(-1)
                flat[::7] = 0.0
                flat[3::11] = -0.0
            lay[name] = np.asarray(g, dtype=dtype)
        out.append(lay)
    return out


def bits_equal(a, b) -> bool:
    from tgsim.backend import to_numpy

    a, b = np.ascontiguousarray(to_numpy(a)), np.ascontiguousarray(to_numpy(b))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def compare(name: str, ref: dict, got: dict, failures: list, rank: int) -> None:
    if list(ref) != list(got):
        failures.append(f"rank {rank} {name}: layers {list(got)} != {list(ref)}")
        return
    for k in ref:
        if not bits_equal(ref[k], got[k]):
            from tgsim.backend import to_numpy

            r, g = to_numpy(ref[k]), to_numpy(got[k])
            diff = int(np.sum(r.reshape(-1).view(np.uint32) != g.reshape(-1).view(np.uint32))) \
                if r.shape == g.shape and r.dtype == g.dtype == np.float32 else -1
            failures.append(f"rank {rank} {name}: layer {k!r} differs ({diff} elements; "
                            f"{r.dtype}{r.shape} vs {g.dtype}{g.shape})")


def terngrad_cases():
    for pack in ("2bit", "base3"):
        for clip in ("none", "explicit"):
            codec = dict(clip=clip, packing=pack, min_size=5, float_layers=("conv.b",))
            yield f"{pack}/{clip}/allreduce", codec, "allreduce", True, False
            yield f"{pack}/{clip}/allreduce-unshared", codec, "allreduce", False, False
            yield f"{pack}/{clip}/allgather", codec, "allgather", True, False
            yield f"{pack}/{clip}/allgather-unshared", codec, "allgather", False, False
            yield f"{pack}/{clip}/ps", codec, "ps", True, False
            yield f"{pack}/{clip}/ps-unshared", codec, "ps", False, False
            yield f"{pack}/{clip}/ps-reternarize", codec, "ps", True, True
            yield f"{pack}/{clip}/ps-unshared-reternarize", codec, "ps", False, True
            yield f"{pack}/{clip}/sharded_ps", codec, "sharded_ps", True, False
    codec = dict(clip="explicit", packing="2bit", min_size=5)
    yield "2bit/explicit/allgather-reternarize", codec, "allgather", True, True     # protocol parity
    yield "2bit/explicit/allreduce-reternarize", codec, "allreduce", True, True


def to_device(layers: list[dict], gpu: bool) -> list[dict]:
    if not gpu:
        return layers
    from tgsim.backend import get_xp

    cp = get_xp("cupy")
    return [{k: cp.asarray(v) for k, v in lay.items()} for lay in layers]


def cases(n: int):
    """The equality cases for N workers: dicts with name, kind and inputs (all workers' data)."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange import InProcessExchange
    from tgsim.rng import StreamKey

    for dtype in (np.float32, np.float64):
        yield dict(name=f"fp32/{np.dtype(dtype).name}", kind="fp32", layers=make_layers(n, SEED + 1, dtype))
    for step, (name, kw, mode, shared, ret) in enumerate(terngrad_cases(), start=1):
        codec = TernGrad(**kw)
        layers = make_layers(n, SEED + step, easy=TERNARY_HINT)
        scalings = [codec.scaling(lay) for lay in layers]
        local = np.stack([codec.local_scalers(sc) for sc in scalings])
        scal = InProcessExchange(n).max_scalers(local) if shared else None
        msgs = [codec.encode(layers[w], StreamKey(SEED, step, w), scal, scalings[w]) for w in range(n)]
        yield dict(name=name, kind="terngrad", codec_kw=kw, codec=codec, mode=mode, shared=shared, step=step,
                   layers=layers, local_scalers=local, shared_scalers=scal, messages=msgs,
                   rkey=StreamKey(SEED, step, n, 0) if ret else None)


def reference(case: dict, n: int) -> dict:
    """The in-process exchange's result for a case (what every rank must reproduce)."""
    from tgsim.exchange import InProcessExchange

    ex = InProcessExchange(n)
    if case["kind"] == "fp32":
        return ex.mean_fp32(case["layers"])[0]
    return ex.aggregate(case["codec"], case["messages"], case["mode"], case["shared"], case["rkey"])[0]


def run_equality(ex, gpu: bool, failures: list, dump: dict, tag: str, deferred: bool = False) -> int:
    """All modes against the in-process exchange; returns the number of comparisons. deferred: this
    rank's messages encode their codes when the exchange sends them (TernGrad.encode(deferred=True))."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange import InProcessExchange, mean_of_layers
    from tgsim.rng import StreamKey

    n, rank = ex.n_workers, ex.rank
    count = 0
    for case in cases(n):
        name = tag + case["name"]
        ref = reference(case, n)
        if case["kind"] == "fp32":
            layers = case["layers"]
            if n >= 3:   # the data must tell summation orders apart, or the check is empty
                other = mean_of_layers(layers[1:] + layers[:1], n)
                if all(bits_equal(ref[k], other[k]) for k in ref):
                    failures.append(f"rank {rank} {name}: test data is not order-sensitive")
            got, b = ex.mean_fp32(to_device(layers, gpu)[rank:rank + 1])
        else:
            shared_mpi = ex.max_scalers(case["local_scalers"][rank:rank + 1])
            if not bits_equal(InProcessExchange(n).max_scalers(case["local_scalers"]), shared_mpi):
                failures.append(f"rank {rank} {name}: shared scalers differ")
            if gpu:
                codec = TernGrad(**case["codec_kw"], kernels="cuda")
                dev = to_device(case["layers"][rank:rank + 1], True)[0]
                scal = shared_mpi if case["shared"] else None
                mine = codec.encode(dev, StreamKey(SEED, case["step"], rank), scal, codec.scaling(dev))
            elif deferred:
                codec, lay = case["codec"], case["layers"][rank]
                scal = shared_mpi if case["shared"] else None
                mine = codec.encode(lay, StreamKey(SEED, case["step"], rank), scal, codec.scaling(lay), deferred=True)
            else:
                codec, mine = case["codec"], case["messages"][rank]
            got, b = ex.aggregate(codec, [mine], case["mode"], case["shared"], case["rkey"])
        compare(name, ref, got, failures, rank)
        if n > 1 and not (b.sent > 0 and b.received > 0):
            failures.append(f"rank {rank} {name}: no bytes counted ({b})")
        dump[name] = got
        count += 1
    # control
    vals = np.random.default_rng(SEED).standard_normal(n) * 10.0 ** np.arange(n)
    if ex.mean_scalar(float(vals[rank])) != float(np.sum(vals)) / n:
        failures.append(f"rank {rank} {tag}mean_scalar differs from the simulator's")
    if ex.any_true(False) or not ex.any_true(rank == n - 1):
        failures.append(f"rank {rank} {tag}any_true is wrong")
    ex.barrier()
    return count + 2


def run_faults(ex, failures: list) -> int:
    """Malformed payloads and different configs: the right error, on every rank, naming the rank."""
    from tgsim.codecs import TernGrad
    from tgsim.exchange.mpi import PeerPayloadError, RankConfigMismatchError
    from tgsim.rng import StreamKey

    n, rank = ex.n_workers, ex.rank
    if n < 2:
        return 0
    codec = TernGrad(clip="none", min_size=5, float_layers=("conv.b",))
    lay = make_layers(n, SEED)[rank]
    sc = codec.scaling(lay)
    shared = ex.max_scalers(codec.local_scalers(sc)[None])
    msg = codec.encode(lay, StreamKey(SEED, 99, rank), shared, sc)
    head = len(msg.layout.header_bytes())
    bad = n - 1

    def magic(b: bytes) -> bytes:
        return b"XXXX" + b[4:]

    def invalid_code(b: bytes) -> bytes:          # first layer is ternary: scaler, then codes
        return b[:head + 4] + b"\xff" + b[head + 5:]

    def truncated(b: bytes) -> bytes:
        return b[:-3]

    def late_code(b: bytes) -> bytes:             # the last layer is ternary: its last byte of codes
        return b[:-1] + b"\xff"

    def scaler(b: bytes) -> bytes:
        return b[:head] + np.float32(np.frombuffer(b[head:head + 4], np.float32)[0] * 2).tobytes() + b[head + 4:]

    cases = [(mode, fault) for mode in ("allgather", "ps") for fault in (magic, invalid_code, late_code, truncated,
                                                                          scaler)]
    texts = []
    for mode, corrupt in cases:
        original = ex._serialize
        if rank == bad:
            ex._serialize = lambda m, c=corrupt, o=original: c(o(m))
        try:
            ex.aggregate(codec, [msg], mode, True)
            failures.append(f"rank {rank} fault {mode}/{corrupt.__name__}: no error raised")
        except PeerPayloadError as e:
            if f"from rank {bad}" not in str(e):
                failures.append(f"rank {rank} fault {mode}/{corrupt.__name__}: error does not name rank {bad}: {e}")
            texts.append(f"{mode}/{corrupt.__name__}: {e}")
        finally:
            ex._serialize = original
    # integer all-reduce: one rank contributes code sums of 127 (corrupt); every rank must raise
    import dataclasses

    def corrupt_layers(kern, *a, **k):      # the whole-step form (Numba): every layer's sums into out=
        out = kern.sum_codes_layers(*a, **k)
        k["out"][...] = 127
        return out

    class CorruptSums(TernGrad):
        def kernels_for(self, xp):
            kern = super().kernels_for(xp)
            methods = {"__getattr__": lambda _, k: getattr(kern, k),
                       "sum_codes": lambda _, *a, **k: kern.sum_codes(*a, **k) * 0 + 127}
            if hasattr(kern, "sum_codes_layers"):
                methods["sum_codes_layers"] = lambda _, *a, **k: corrupt_layers(kern, *a, **k)
            return type("CorruptKernels", (), methods)()

    sender = CorruptSums(**{f.name: getattr(codec, f.name) for f in dataclasses.fields(codec) if f.init}) \
        if rank == bad else codec
    try:
        ex.aggregate(sender, [msg], "allreduce", True)
        failures.append(f"rank {rank} fault allreduce/code sum beyond N: no error raised")
    except PeerPayloadError as e:
        if "beyond" not in str(e):
            failures.append(f"rank {rank} fault allreduce/code sum beyond N: unexpected message {e}")
        texts.append(f"allreduce/code sum beyond N: {e}")
    # different configs: the last rank has another digest
    try:
        ex.check_same_config("same" if rank != bad else "other")
        failures.append(f"rank {rank} config mismatch: no error raised")
    except RankConfigMismatchError as e:
        if f"on rank {bad}" not in str(e):
            failures.append(f"rank {rank} config mismatch: error does not name rank {bad}: {e}")
        everyone = ex.comm.allgather(str(e))
        if len(set(everyone)) != 1:
            failures.append(f"rank {rank} config mismatch: ranks raised different messages")
        texts.append(f"config: {e}")
    ex.check_same_config("same")
    # the communicator is still in step after all the errors
    ex.aggregate(codec, [msg], "ps", True)
    if rank == 0:
        for t in texts:
            print(f"  fault ok: {t}")
    return len(cases) + 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tgsim.mpi_runs.selftest", description=__doc__.split("\n")[0])
    p.add_argument("--gpu", action="store_true", help="CuPy buffers on the node-local GPU")
    p.add_argument("--faults", action="store_true", help="also check the error paths")
    p.add_argument("--dump", help="directory for rank<r>.npz with the MPI results")
    args = p.parse_args(argv)
    from tgsim.exchange.mpi_env import mpi_or_exit

    mpi_or_exit("tgsim.mpi_runs.selftest")        # one line naming the fix: no mpi4py, mixed MPIs, no mpiexec
    from tgsim.exchange.mpi import MPIExchange

    ex = MPIExchange()
    if args.gpu and ex.device is None:
        print(f"[rank {ex.rank}] --gpu: no CUDA device/CuPy", file=sys.stderr, flush=True)
        ex.comm.Abort(2)
    failures: list[str] = []
    dump: dict = {}
    count = run_equality(ex, args.gpu, failures, dump, "")
    # many buckets per phase, the parameter server over MPI's Gather/Bcast instead of Send/Recv, and the
    # whole-message (blocking) all-gather that CuPy buffers take
    small = MPIExchange(ex.comm, bucket_bytes=64, gpu=args.gpu, ps_transport="collective", chunk=-1)
    count += run_equality(small, args.gpu, failures, {}, "bucketed-collective/")
    # the parameter server cut into pieces of 40 elements (many pieces per layer and layers per piece)
    pieces = MPIExchange(ex.comm, gpu=args.gpu, chunk=40)
    count += run_equality(pieces, args.gpu, failures, {}, "pieces/")
    count += run_equality(pieces, args.gpu, failures, {}, "pieces-deferred/", deferred=True)
    native = MPIExchange(ex.comm, exact=False, gpu=args.gpu)
    layers = to_device(make_layers(ex.n_workers, SEED + 1), args.gpu)
    got, _ = native.mean_fp32(layers[ex.rank:ex.rank + 1])             # runs; bits may differ (MPI's order)
    from tgsim.exchange import InProcessExchange

    ref, _ = InProcessExchange(ex.n_workers).mean_fp32(make_layers(ex.n_workers, SEED + 1))
    from tgsim.backend import to_numpy

    differ = sum(int(np.sum(to_numpy(got[k]).reshape(-1).view(np.uint32) != ref[k].reshape(-1).view(np.uint32)))
                 for k in ref)
    for k in ref:   # the benchmark-only path: other rounding, same mean to float32 accuracy
        g, r = to_numpy(got[k]).astype(np.float64), ref[k].astype(np.float64)
        tol = 4 * ex.n_workers * np.finfo(np.float32).eps * (np.abs(r) + np.abs(g).max(initial=0.0) + 1e-30)
        if g.shape != r.shape or not np.all(np.abs(g - r) <= tol):
            failures.append(f"rank {ex.rank} native fp32: layer {k!r} is not the mean to float32 accuracy")
    if ex.rank == 0:
        print(f"  native MPI Allreduce fp32 (exact=False): {differ} of "
              f"{sum(v.size for v in ref.values())} elements differ from the simulator's bits")
    if args.faults:
        count += run_faults(ex, failures)
        count += run_faults(pieces, failures)
        count += run_faults(small, failures)
    if args.dump:
        from tgsim.backend import to_numpy

        Path(args.dump).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.dump) / f"rank{ex.rank}.npz",
                 **{f"{case}|{k}": to_numpy(v) for case, res in dump.items() for k, v in res.items()})
    everyone = ex.comm.gather(failures, root=0)
    bad = ex.comm.bcast(sum(len(f) for f in everyone) if ex.rank == 0 else None, root=0)
    if ex.rank == 0:
        for f in [f for fs in everyone for f in fs]:
            print(f)
        where = f"{ex.n_workers} ranks, {'cupy' if args.gpu else 'numpy'} buffers" + \
            (f", CUDA-aware MPI: {ex.cuda_aware}" if args.gpu else "")
        print(f"selftest {'FAILED' if bad else 'OK'}: {count} comparisons per rank, {bad} failures ({where})",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
