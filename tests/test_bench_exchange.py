"""`tgsim bench exchange` smoke test: a shaped private network namespace, MPI over TCP through it,
N = 2, tiny gradients. Skipped, with the reason, where namespaces or tc are unavailable (not root,
no CAP_NET_ADMIN, no iproute2) or MPI is missing. Well under a minute."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tgsim.bench import exchange as be
from tgsim.codecs.packing import uint_width
from tgsim.exchange.base import ring_allreduce_bytes
from tgsim.exchange.mpi import CHUNK
from tgsim.exchange.sharded import shard_pieces, shard_plan

OK, WHY = be.check_environment()
needs_netns = pytest.mark.skipif(not OK, reason=f"cannot emulate a network here: {WHY}")
LAYERS = 16         # the bench's AlexNet-shaped gradient: one float32 scaler per layer


def _per_rank(cell) -> list[float]:
    """A payload_sent_by_rank / payload_received_by_rank cell ("b0;b1;...") as floats, rank order."""
    return [float(v) for v in str(cell).split(";")]


def check_sharded_bytes(row, mode: str, n: int, params: int) -> None:
    """tg_sharded_ps (pipelined: `shard_pieces(T, N, "2bit", CHUNK)`, one header per piece) and
    tg_sharded_ps_whole (one Alltoallv + one Allgatherv: `shard_plan(T, N, "2bit")`): every rank's
    bytes are the plan's `code_bytes(rank)` (every bench layer is ternary: T = P) plus the scaler
    all-reduce, and the busiest link carries (N-1)/N (2 + w) bits per element."""
    sc = ring_allreduce_bytes(4 * LAYERS, n)
    assert row["payload_scalers"] == pytest.approx(sc)
    whole = mode.endswith("_whole")
    assert row["chunk"] == (-1 if whole else CHUNK)
    plan = shard_plan(params, n, "2bit") if whole else shard_pieces(params, n, "2bit", CHUNK)
    sent, recv = _per_rank(row["payload_sent_by_rank"]), _per_rank(row["payload_received_by_rank"])
    assert len(sent) == len(recv) == n
    for rank in range(n):
        want = plan.code_bytes(rank)
        assert sent[rank] == pytest.approx(want.sent + sc, abs=1e-6), rank
        assert recv[rank] == pytest.approx(want.received + sc, abs=1e-6), rank
    assert row["payload_total"] == pytest.approx(sum(sent))
    assert row["payload_max_link"] == pytest.approx(max(max(sent), max(recv)))
    assert row["payload_max_link"] == pytest.approx((n - 1) / n * (2 + plan.width) / 8 * params, rel=0.01)


def check_rank0_ps_bytes(row, n: int, params: int) -> None:
    """tg_ps: rank 0's link carries (N-1) x a worker's bytes (the scaler all-reduce, the same on every
    rank, aside): N-1 slots of 2-bit codes in, N-1 downlinks of sums at w = ceil(log2(2N+1)) bits out;
    every worker alike."""
    sc = row["payload_scalers"]
    sent, recv = _per_rank(row["payload_sent_by_rank"]), _per_rank(row["payload_received_by_rank"])
    assert len(set(sent[1:])) == 1 and len(set(recv[1:])) == 1
    assert sent[0] - sc == pytest.approx((n - 1) * (recv[1] - sc))
    assert recv[0] - sc == pytest.approx((n - 1) * (sent[1] - sc))
    assert sent[0] - sc == pytest.approx((n - 1) * uint_width(n) / 8 * params, rel=0.01)    # the direction
    assert recv[0] - sc == pytest.approx((n - 1) * 2 / 8 * params, rel=0.01)
    assert row["payload_rank0_sent"] == pytest.approx(sent[0])
    assert row["payload_rank0_received"] == pytest.approx(recv[0])


def test_layer_split_and_rate_parsing():
    from tgsim.bench.exchange_rank import layer_sizes

    sizes = layer_sizes(4_000_000)
    assert len(sizes) == 16 and sum(s for _, s in sizes) == 4_000_000
    big = sorted((s for _, s in sizes), reverse=True)
    assert big[0] / 4_000_000 > 0.5                       # AlexNet's fc6 dominates
    assert be.rate_bits("1gbit") == 1e9 and be.rate_bits("100mbit") == 1e8
    with pytest.raises(ValueError):
        be.rate_bits("fast")


def test_summarize_ratios_targets_and_causes():
    """Pure pandas: speedup, byte ratio (total on the shared medium, busiest link on a switch), target."""
    rows = []
    for topo in ("shared", "switch"):
        for mode, t, tot, link, enc, dec in (("fp32_native", 1.0, 800e6, 400e6, 0, 0.01),
                                             ("fp32_exact", 1.1, 800e6, 400e6, 0, 0.05),
                                             ("tg_allreduce", 0.3, 200e6, 100e6, 0.01, 0.02),
                                             ("tg_ps", 0.9, 60e6, 40e6, 0.01, 0.8),
                                             ("tg_ps_whole", 0.9, 60e6, 40e6, 0.01, 0.8)):
            rows.append(dict(topology=topo, rate="1gbit", ranks=2, params=4_000_000, mode=mode, t_step=t,
                             t_encode=enc, t_decode=dec, t_wire=t - enc - dec, payload_total=tot,
                             payload_max_link=link, wire_bytes=tot * 1.01, cores=2,
                             payload_rank0_received=tot / 3, payload_rank0_sent=2 * tot / 3))
    df = be.summarize(pd.DataFrame(rows))
    r = df.set_index(["topology", "mode"])
    assert r.loc[("shared", "tg_allreduce"), "speedup"] == pytest.approx(1 / 0.3)
    assert r.loc[("shared", "tg_allreduce"), "byte_ratio"] == pytest.approx(4.0)
    assert r.loc[("switch", "tg_ps"), "byte_ratio"] == pytest.approx(10.0)     # busiest link 400 / 40
    assert r.loc[("shared", "tg_allreduce"), "meets_target"] == 1.0            # 3.33 / 4 = 83% >= 75%
    assert r.loc[("shared", "tg_ps"), "meets_target"] == 0.0                   # 1.11 / 13.3
    assert "CPU-bound" in r.loc[("shared", "tg_ps"), "cause"]
    # the whole-message server's link: 20 MB in, then 40 MB out, on a switch: 480 ms in sequence, 320
    # ms overlapped; the pipelined server (tg_ps) overlaps them, so that is not its cause
    assert "(20.0 MB in) and then the downlink (40.0 MB out) one after the other: 480 ms at line rate, " \
           "against 320 ms" in r.loc[("switch", "tg_ps_whole"), "cause"]
    assert "one after the other" not in r.loc[("switch", "tg_ps"), "cause"]
    assert "one after the other" not in r.loc[("shared", "tg_ps_whole"), "cause"]
    assert np.isnan(r.loc[("shared", "fp32_exact"), "meets_target"])
    # unshaped (rate none, the host-bound reference rows): no line rate, no line-rate cause, no error
    none = be.summarize(pd.DataFrame(rows).assign(rate="none")).set_index(["topology", "mode"])
    assert "one after the other" not in none.loc[("switch", "tg_ps_whole"), "cause"]
    assert np.isnan(none.loc[("switch", "tg_ps_whole"), "meets_target"])


def test_summarize_target_threshold():
    base = dict(topology="shared", rate="1gbit", ranks=2, params=4_000_000, t_encode=0.0, t_decode=0.0,
                payload_max_link=1.0, cores=2)
    df = be.summarize(pd.DataFrame([
        {**base, "mode": "fp32_native", "t_step": 1.0, "t_wire": 1.0, "payload_total": 400.0, "wire_bytes": 400.0},
        {**base, "mode": "tg_allreduce", "t_step": 1 / 3.1, "t_wire": 1 / 3.1, "payload_total": 100.0,
         "wire_bytes": 100.0},
        {**base, "mode": "tg_allgather", "t_step": 1 / 2.9, "t_wire": 1 / 2.9, "payload_total": 100.0,
         "wire_bytes": 100.0}]))
    r = df.set_index("mode")
    assert r.loc["tg_allreduce", "meets_target"] == 1.0          # 3.1 / 4 = 78% >= 75%
    assert r.loc["tg_allgather", "meets_target"] == 0.0          # 2.9 / 4 = 72%


@needs_netns
def test_netem_forces_mpi_through_the_shaped_link():
    """netem.sh --check: a 4 MB Allreduce on 2 ranks must put >= 90% of its bytes on the shaped lo."""
    p = subprocess.run(["bash", str(be.NETEM), "--topology", "shared", "--rate", "1gbit", "--ranks", "2",
                        "--python", sys.executable, "--check"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[netem check]" in p.stdout and "crossed lo" in p.stdout


@needs_netns
def test_bench_smoke_shared_1gbit(tmp_path):
    raw = tmp_path / "raw.csv"
    rc = be.run_point("shared", "1gbit", 2, [400_000], raw, steps=2, warmup=1, budget=0, timeout=120, quiet=True)
    assert rc == 0
    df = be.summarize(pd.read_csv(raw))
    assert set(df["mode"]) == {"fp32_native", "fp32_exact", "tg_allreduce", "tg_ps", "tg_allgather", "tg_sharded_ps"}
    r = df.set_index("mode")
    # the bytes went over the shaped interface, and the count matches the payload model
    for mode in ("fp32_native", "tg_allreduce", "tg_allgather", "tg_sharded_ps"):
        assert r.loc[mode, "wire_bytes"] == pytest.approx(r.loc[mode, "payload_total"], rel=0.1)
    # the link really is shaped: fp32 needs >= 70% of its line time at 1 Gb/s (unshaped lo is ~10x faster)
    line = r.loc["fp32_native", "payload_total"] * 8 / 1e9
    assert r.loc["fp32_native", "t_wire"] >= 0.7 * line
    assert r.loc["tg_allgather", "byte_ratio"] == pytest.approx(16, rel=0.02)
    assert r.loc["tg_allreduce", "byte_ratio"] == pytest.approx(4, rel=0.01)
    # sharded_ps at N = 2: (N-1)/N (2 + 3) = 2.5 bits per element each way against fp32's 32
    assert r.loc["tg_sharded_ps", "byte_ratio"] == pytest.approx(32 / 2.5, rel=0.01)
    check_sharded_bytes(r.loc["tg_sharded_ps"], "tg_sharded_ps", 2, 400_000)
    assert (df["t_step"] > 0).all() and (df["speedup"] > 0).all()


@needs_netns
def test_sharded_and_rank0_ps_bytes_on_a_switch(tmp_path):
    """N = 3 on the switch topology (one shaped full-duplex link per rank), 1.2M elements (shards of
    400k: two pieces each at the default chunk of 2^18), several seconds: tg_sharded_ps's bytes per
    rank are `shard_pieces(P, N, "2bit", CHUNK).code_bytes(rank)` plus the scaler all-reduce,
    tg_sharded_ps_whole's `shard_plan(P, N, "2bit").code_bytes(rank)` plus it (one header less per
    extra piece each way), and they are what crossed the ranks' interfaces; rank 0's ps link
    carries (N-1) x a worker's bytes, so its busiest link is heavier than every sharded link."""
    raw = tmp_path / "raw.csv"
    n, params = 3, 1_200_000
    modes = ["fp32_native", "tg_ps", "tg_sharded_ps", "tg_sharded_ps_whole"]
    rc = be.run_point("switch", "1gbit", n, [params], raw, steps=2, warmup=1, budget=0, timeout=180, quiet=True,
                      modes=modes)
    assert rc == 0
    df = be.summarize(pd.read_csv(raw))
    assert list(df["mode"]) == modes
    r = df.set_index("mode")
    for mode in ("tg_sharded_ps", "tg_sharded_ps_whole"):
        check_sharded_bytes(r.loc[mode], mode, n, params)
        # on the switch every rank's eth0 tx is counted: the sum is what the ranks sent (+ TCP/IP, Barriers)
        assert r.loc[mode, "wire_bytes"] == pytest.approx(r.loc[mode, "payload_total"], rel=0.1)
        assert r.loc["tg_ps", "payload_max_link"] > 1.5 * r.loc[mode, "payload_max_link"]
        assert r.loc[mode, "t_step"] > 0 and r.loc[mode, "t_wire"] > 0
    # two pieces per shard: one more 8-byte header per shard each way, to and from N-1 peers
    extra = _per_rank(r.loc["tg_sharded_ps", "payload_sent_by_rank"])[0] - \
        _per_rank(r.loc["tg_sharded_ps_whole", "payload_sent_by_rank"])[0]
    assert extra == pytest.approx(2 * (n - 1) * 8)
    check_rank0_ps_bytes(r.loc["tg_ps"], n, params)


@needs_netns
@pytest.mark.heavy
def test_the_whole_quick_grid(tmp_path):
    """`tgsim bench exchange --quick` (the README's command in its quick form: N = 2, 4 x 1M, 4M
    elements, every mode) writes one summary row per (N, size, mode), all marked quick; `make test`
    runs its first point only (tests/test_readme_commands.py)."""
    p = subprocess.run([sys.executable, "-m", "tgsim.cli", "bench", "exchange", "--quick", "--quiet", "--out",
                        str(tmp_path / "bx.csv")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    df = pd.read_csv(tmp_path / "bx.csv")
    assert set(zip(df.ranks, df.params)) == {(2, 1_000_000), (2, 4_000_000), (4, 1_000_000), (4, 4_000_000)}
    assert df["quick"].astype(bool).all() and (df["t_step"] > 0).all()
    assert set(df["mode"]) == {"fp32_native", "fp32_exact", "tg_allreduce", "tg_ps", "tg_allgather", "tg_sharded_ps"}
    assert len(df) == 4 * 6
    for row in df[df["mode"] == "tg_sharded_ps"].to_dict("records"):
        check_sharded_bytes(row, "tg_sharded_ps", int(row["ranks"]), int(row["params"]))
    for row in df[df["mode"] == "tg_ps"].to_dict("records"):
        check_rank0_ps_bytes(row, int(row["ranks"]), int(row["params"]))


def test_cmd_explains_when_namespaces_are_unavailable(monkeypatch, capsys):
    monkeypatch.setattr(be, "check_environment", lambda shaping=True: (False, "not root (test)"))
    p = __import__("argparse").ArgumentParser()
    be.add_arguments(p)
    assert be.cmd(p.parse_args(["--quick"])) == 3
    assert "not root (test)" in capsys.readouterr().err


@needs_netns
@pytest.mark.parametrize("budget, steps", [(1e-6, 3), (600.0, 4)])
def test_budget_sets_the_timed_steps(tmp_path, budget, steps):
    """exchange_rank times its last warm-up round: a budget shorter than that round gets --min-steps
    (3) timed steps, a long one all of --steps (4)."""
    raw = tmp_path / "raw.csv"
    rc = be.run_point("shared", "1gbit", 2, [100_000], raw, steps=4, warmup=2, budget=budget, timeout=120,
                      quiet=True, modes=["fp32_native", "tg_allreduce"])
    assert rc == 0
    df = pd.read_csv(raw)
    assert list(df["mode"]) == ["fp32_native", "tg_allreduce"] and (df["steps"] == steps).all()


def _fake_point(topology, rate, ranks, params, raw_csv, **kw):
    """run_point without a network: one fp32_native and one tg_allreduce row per size, appended."""
    base = dict(topology=topology, rate=rate, ranks=ranks, t_encode=0.0, t_decode=0.0, t_wire=0.5,
                payload_max_link=100.0, payload_total=200.0, wire_bytes=200.0, cores=2, steps=kw.get("steps", 5),
                t_step_min=0.9, t_step_max=1.1, loadavg=0.1)
    rows = [{**base, "params": p, "mode": m, "t_step": t} for p in params
            for m, t in (("fp32_native", 1.0), ("tg_allreduce", 0.4))]
    pd.DataFrame(rows).to_csv(raw_csv, mode="a", header=not raw_csv.exists(), index=False)
    return 0


@pytest.mark.parametrize("quick", [True, False])
def test_the_csv_says_whether_quick_wrote_it(quick, tmp_path, monkeypatch, capsys):
    """`tgsim bench exchange [--quick]` writes quick = True / False in every row of its CSV (the same
    default path for both), the printed table starts with QUICK when quick, and is_quick reads it back."""
    import argparse

    monkeypatch.setattr(be, "check_environment", lambda shaping=True: (True, "ok"))
    monkeypatch.setattr(be, "run_point", _fake_point)
    p = argparse.ArgumentParser()
    be.add_arguments(p)
    out = tmp_path / "bench.csv"
    argv = ["--out", str(out), "--quiet", "--ranks", "2", "--params", "1e6"] + (["--quick"] if quick else [])
    assert be.cmd(p.parse_args(argv)) == 0
    df = pd.read_csv(out)
    assert df["quick"].dtype == bool and (df["quick"] == quick).all() and len(df) == 2 * (1 if quick else 4)
    assert be.is_quick(df) is quick
    printed = capsys.readouterr().out
    assert (be.QUICK_MARK in printed) is quick and ("quick = True" in printed) is quick


def test_is_quick_reads_the_column_and_guesses_only_when_asked():
    """The quick column wins over the grid (a full-grid CSV marked quick is quick, a quick-grid CSV
    marked False is not; 'True' strings after a concat count); without the column a CSV is not quick
    unless guess_from_grid, which counts rows inside the --quick grid at <= 3 steps."""
    grid = pd.DataFrame([dict(topology="shared", rate="1gbit", ranks=n, params=p, steps=3, mode="tg_ps")
                         for n in (2, 4) for p in (1_000_000, 4_000_000)])
    assert be.is_quick(grid.assign(quick=False), guess_from_grid=True) is False
    assert be.is_quick(grid.assign(ranks=8, quick=True)) is True
    assert be.is_quick(grid.assign(quick=["True", "False", "False", "False"])) is True
    assert be.is_quick(grid) is False and be.is_quick(grid, guess_from_grid=True) is True
    assert be.is_quick(grid.assign(steps=5), guess_from_grid=True) is False
    assert be.is_quick(grid.assign(ranks=8), guess_from_grid=True) is False
    assert be.quick_description(grid) == "N = 2, 4, P = 1M, 4M, 3 timed steps"
