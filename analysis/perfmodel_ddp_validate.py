"""The DDP step model's collectives (`perfmodel_ddp`) against `tgsim bench exchange` measurements on
emulated links (tc in a private namespace, MPI over TCP; switch topology: every rank its own shaped
link, so a rank is a node of one GPU in the model).

    python -m tgsim.analysis.perfmodel_ddp_validate results/bench_exchange.csv [--latency 50e-6]

Predicted, per bench row of `MODES` (P gradient elements in one message: the MPI exchange's 64 MiB
buckets hold the bench's whole gradient; N ranks; a link of the row's rate, `latency` per hop,
efficiency 0.9 as compare time's links):
  fp32_native    the all-reduce of 4P bytes: the faster of ring and tree (`perfmodel_ddp.collective`)
  tg_allreduce   the scaler all-reduce (one float per bench layer) + the all-reduce of the int8 code
                 sums, P bytes (2P beyond 127 ranks), + the message header (`message_header_bytes`)
against the bench's t_wire (the time inside MPI collectives, the minimum over ranks); ratio =
predicted / measured, within = |ratio - 1| <= 0.20. The model has no term for the host's CPU work
(the bench's encode and decode: the GPU's in the modeled cluster), so t_exchange and t_step are
shown beside it, not predicted. The shared topology (every byte through one shaped loopback) is not
a DDP cluster and is left out.
"""

from __future__ import annotations

import argparse

import pandas as pd

from tgsim.analysis.perfmodel_ddp import DDPExchange, Link, collective, scaler_allreduce
from tgsim.analysis.perfmodel_emulation import bench_layer_sizes, message_header_bytes

MODES = ("fp32_native", "tg_allreduce")
TOLERANCE = 0.20


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 bits/s (tc's k/m/g prefixes)."""
    r = rate.lower().removesuffix("bit")
    return float(r[:-1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[r[-1]] if r[-1] in "kmg" else float(r)


def predict_wire(mode: str, params: int, ranks: int, link: Link) -> float:
    """Seconds of the collectives of one bench step (module docstring), ranks = nodes of one GPU."""
    ex = DDPExchange("allreduce")
    if mode == "fp32_native":
        return collective(ex, {"reduce": 4.0 * params}, ranks, 1, link, link)[0]
    if mode == "tg_allreduce":
        layers = len(bench_layer_sizes(params))
        width = 1 if ranks <= 127 else 2
        t, _ = collective(ex, {"reduce": width * params + message_header_bytes(layers)}, ranks, 1, link, link)
        return scaler_allreduce(layers, ranks, 1, link, link) + t
    raise ValueError(f"no prediction for mode {mode!r}; modeled: {MODES}")


def validate(rows: pd.DataFrame, latency: float = 50e-6, efficiency: float = 0.9) -> pd.DataFrame:
    """One row per switch-topology bench row of `MODES`: pred_wire, t_wire, ratio, within, and the
    measured t_exchange and t_step beside them."""
    d = rows[(rows.topology == "switch") & rows["mode"].isin(MODES)].copy()
    d["pred_wire"] = [predict_wire(r.mode, int(r.params), int(r.ranks),
                                   Link(r.rate, rate_bits(r.rate), latency, efficiency)) for r in d.itertuples()]
    d["ratio"] = d.pred_wire / d.t_wire
    d["within"] = (d.ratio - 1).abs() <= TOLERANCE
    return d[["rate", "ranks", "params", "mode", "pred_wire", "t_wire", "ratio", "within", "t_exchange", "t_step"]]


def main(argv=None) -> int:
    """Print the table and the points with >= 1M elements within 20 %."""
    ap = argparse.ArgumentParser(prog="python -m tgsim.analysis.perfmodel_ddp_validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--latency", type=float, default=50e-6, help="seconds per hop (default %(default)s)")
    args = ap.parse_args(argv)
    rows = pd.read_csv(args.csv)
    if "quick" in rows and rows.quick.astype(bool).any():
        print(f"{args.csv}: QUICK rows (tgsim bench exchange --quick): numbers not for reporting")
    v = validate(rows, args.latency)
    with pd.option_context("display.width", 200):
        print(v.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    big = v[v.params >= 1_000_000]
    print(f"points with >= 1M elements within {TOLERANCE:.0%} of the measured t_wire: "
          f"{int(big.within.sum())} of {len(big)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
