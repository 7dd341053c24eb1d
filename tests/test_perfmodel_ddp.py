"""The DDP/NCCL step model (analysis/perfmodel_ddp.py): buckets and their latency count, node-aware
collectives, the two parameter servers (rank 0's "ps" and the "sharded_ps" on the workers) against
flow-by-flow counts, the real sharded mode's bytes and their N-scaling, the scaler all-reduce as a
latency and a dependency, codec seconds on the critical path. Synthetic nets, no measurement."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from tgsim.analysis import perfmodel_ddp as ddp
from tgsim.analysis.perfmodel_ddp import HARDWARE, CodecCost, DDPExchange, Link, ddp_step
from tgsim.analysis.perfmodel_nets import Layer, Net
from tgsim.analysis.perfmodel_throughput import Wire

MIB = 1 << 20


def _net(layers: int, mib_each: float) -> Net:
    """`layers` dense layers of mib_each MiB of float32 gradient each, equal MACs."""
    n = int(mib_each * MIB / 4)
    return Net("synthetic", tuple(Layer(f"l{i}", n, n, "fc", ((n,),)) for i in range(layers)), batch=32,
               ref_ms=100.0, ref_batch=32, ref_gpu="p100")


def _fp32(G: int) -> Wire:
    return Wire("fp32", {G: {"up": 4.0, "down": 4.0, "reduce": 4.0}})


def test_buckets_pay_one_latency_each():
    """One 100 MiB layer is one bucket; 100 layers of 1 MiB in 25 MiB buckets are 4 (one per layer with
    bucket_mb = 0: 100). The step's latency is the ring's per-message latency times the bucket count
    (N = 64 on P100 nodes of 4: 2 (n-1) a + 2 (G-n) a_i per message)."""
    G, hw, link = 64, HARDWARE["p100-fp32"], Link("10 Gb/s", 10e9, 50e-6)
    ex = DDPExchange("ring", bucket_mb=25)
    n = G // hw.gpus_per_node
    per_msg = 2 * (n - 1) * link.latency + 2 * (G - n) * hw.intra.latency
    one = ddp_step(_net(1, 100), _fp32(G), G, hw, link, ex)
    many = ddp_step(_net(100, 1), _fp32(G), G, hw, link, ex)
    flat = ddp_step(_net(100, 1), _fp32(G), G, hw, link, DDPExchange("ring", bucket_mb=0))
    assert (one["buckets"], many["buckets"], flat["buckets"]) == (1, 4, 100)
    assert math.isclose(one["latency"], per_msg, rel_tol=1e-9)
    assert math.isclose(many["latency"], 4 * per_msg, rel_tol=1e-9)
    assert math.isclose(flat["latency"], 100 * per_msg, rel_tol=1e-9)
    assert [b.elements for b in ddp.buckets(_net(100, 1), 25)] == [25 * MIB // 4] * 4


def test_gpus_inside_one_node_pay_no_network_latency():
    """N = 4 on nodes of 4 GPUs: a network of 1 s latency costs nothing (NVLink hops only); N = 8 (two
    nodes) pays it (positive control), in ring, tree, all-gather and both parameter servers."""
    hw, slow = HARDWARE["p100-fp32"], Link("slow", 10e9, 1.0)
    for pat in ("ring", "tree", "allgather", "ps", "sharded_ps"):
        for G, pays in ((4, False), (8, True)):
            w = Wire("x", {G: {"up": 1.0, "down": 1.0, "reduce": 1.0}})
            r = ddp_step(_net(4, 10), w, G, hw, slow, DDPExchange(pat, bucket_mb=25, overlap=False))
            assert (r["latency"] >= 1.0) is pays, (pat, G, r["latency"])


def test_allreduce_takes_the_faster_of_ring_and_tree():
    """Small messages over many nodes: the tree (log2 n hops) wins; large ones on few nodes: the ring."""
    hw, link = HARDWARE["p100-fp32"], Link("10 Gb/s", 10e9, 50e-6)
    t, algo = ddp.collective(DDPExchange("allreduce"), {"reduce": 4e3}, 512, 4, link, hw.intra)
    assert algo == "tree" and t < ddp.ring_allreduce(4e3, 512, 4, link, hw.intra)
    t, algo = ddp.collective(DDPExchange("allreduce"), {"reduce": 1e8}, 8, 4, link, hw.intra)
    assert algo == "ring" and t <= ddp.tree_allreduce(1e8, 8, 4, link, hw.intra)


def test_allgather_traffic_grows_with_workers():
    link, intra = Link("zero latency", 10e9, 0.0), Link("NVLink, zero latency", 320e9, 0.0, 1.0)
    t = [ddp.allgather(1e6, G, 4, link, intra) for G in (8, 64, 512)]
    assert t[0] < t[1] < t[2]
    assert math.isclose(t[2], link.seconds(511 * 1e6), rel_tol=1e-12)


def _nic_bytes_by_flows(up: float, down: float, G: int, g: int) -> float:
    """Oracle: the ps sharded one shard per node, every flow enumerated: worker w (node w // g) pushes
    up / M to each shard m and pulls down / M from it; a flow between nodes is charged out on the
    sender's NIC and in on the receiver's. Returns max over NICs and directions of push + that of pull."""
    M = -(-G // g)
    total = 0.0
    for phase, size in (("push", up), ("pull", down)):
        out, inn = [0.0] * M, [0.0] * M
        for w in range(G):
            for m in range(M):
                a, b = (w // g, m) if phase == "push" else (m, w // g)
                if a != b:
                    out[a] += size / M
                    inn[b] += size / M
        total += max(out + inn)
    return total


def _rank0_nic_bytes_by_flows(up: float, down: float, G: int, g: int) -> tuple[float, float]:
    """Oracle: rank 0 the one server, every flow enumerated: worker w != 0 pushes its whole message to
    rank 0 and pulls the whole answer; a flow between nodes is charged on both NICs. Returns rank 0's
    NIC's (in, out) bytes, after checking that no NIC carries more in either direction."""
    inn, out = [0.0] * -(-G // g), [0.0] * -(-G // g)
    for w in range(1, G):
        if w // g != 0:
            out[w // g] += up
            inn[0] += up
            out[0] += down
            inn[w // g] += down
    assert max(inn + out) == max(inn[0], out[0])
    return inn[0], out[0]


@pytest.mark.parametrize("G", [8, 64])
def test_sharded_ps_charges_the_workers_nics(G):
    """The sharded ps on the worker nodes (pattern "sharded_ps") costs the busiest NIC's bytes
    (flow-by-flow oracle) plus one latency per phase; pattern "ps" is rank 0's one server, which the
    oracle does not match (negative control), nor do dedicated servers (M = nodes: every worker's
    whole message on its NIC, g x S)."""
    hw, link = HARDWARE["p100-fp32"], Link("1 Gb/s", 1e9, 0.0)
    up, down = 0.25e6, 0.75e6
    t = ddp.sharded_ps(up, down, G, 4, link, hw.intra)
    assert math.isclose(t, link.seconds(_nic_bytes_by_flows(up, down, G, 4)), rel_tol=1e-12)
    assert math.isclose(ddp.collective(DDPExchange("sharded_ps"), {"up": up, "down": down}, G, 4, link,
                                       hw.intra)[0], t, rel_tol=1e-12)
    rank0 = ddp.parameter_server(up, down, G, 4, link, hw.intra)
    dedicated = ddp.parameter_server(up, down, G, 4, link, hw.intra, servers=G // 4)
    assert rank0 > 1.5 * t and dedicated > t and not math.isclose(dedicated, t, rel_tol=1e-3)
    with pytest.raises(ValueError, match="servers"):
        DDPExchange("sharded_ps", servers=2)


@pytest.mark.parametrize("G", [8, 64])
def test_ps_is_rank_0s_one_server(G):
    """Pattern "ps" (servers = 0) is the code's ps mode: rank 0's NIC takes the other nodes' G - g
    messages in and sends as many answers out (flow-by-flow oracle), full duplex: whole messages (one
    piece) cost in + out, K pipelined pieces max(in, out) + min(in, out) / K; one latency each way.
    `ddp_step` cuts a bucket into pieces of 2^18 elements."""
    hw, link = HARDWARE["p100-fp32"], Link("1 Gb/s", 1e9, 1e-3)
    up, down = 0.25e6, 0.75e6
    b_in, b_out = _rank0_nic_bytes_by_flows(up, down, G, 4)
    t_in, t_out = link.seconds(b_in), link.seconds(b_out)
    assert math.isclose(ddp.parameter_server(up, down, G, 4, link, hw.intra), t_in + t_out + 2e-3, rel_tol=1e-12)
    t, algo = ddp.collective(DDPExchange("ps"), {"up": up, "down": down}, G, 4, link, hw.intra, pieces=8)
    assert algo == "ps(rank 0)" and math.isclose(t, t_out + t_in / 8 + 2e-3, rel_tol=1e-12)
    assert ddp.collective(DDPExchange("ps", servers=2), {"up": up, "down": down}, G, 4, link,
                          hw.intra)[1] == "ps(2 dedicated servers)"
    assert ddp.pieces_of(1) == 1 and ddp.pieces_of(1 << 18) == 1 and ddp.pieces_of((1 << 18) + 1) == 2
    assert DDPExchange("ps").server == "rank 0" and DDPExchange("sharded_ps").server == "sharded over the workers"


def test_rank_0_grows_linearly_with_workers_and_the_sharded_server_stays_flat():
    """At fixed bytes per rank (2 bits up, 4 bits down per element of a 25 MiB bucket), one GPU per node,
    no latency: rank 0's server carries N-1 messages, so its exchange at N is (N-1)/7 times that at
    N = 8; the sharded server's is (N-1)/N of one message each way through every link, within 8/7 of
    its N = 8 value up to N = 512. In ddp_step (a 1 Gb/s link, a 100 MiB net) ps's exposed
    communication grows more than 50-fold from N = 8 to 512, sharded_ps's less than 1.5-fold. Swapping
    the two patterns fails both."""
    one = dataclasses.replace(HARDWARE["p100-fp32"], gpus_per_node=1)
    link = Link("1 Gb/s, no latency", 1e9, 0.0)
    n = 25 * MIB // 4
    b = {"up": n / 4, "down": n / 2}
    Ns = (8, 16, 64, 512)

    def t(pat, N):
        return ddp.collective(DDPExchange(pat), b, N, 1, link, one.intra, pieces=ddp.pieces_of(n))[0]

    ps, sh = [t("ps", N) for N in Ns], [t("sharded_ps", N) for N in Ns]
    for N, a, s in zip(Ns, ps, sh):
        assert math.isclose(a / ps[0], (N - 1) / 7, rel_tol=1e-9), (N, a / ps[0])
        assert math.isclose(s / sh[0], (N - 1) / N * 8 / 7, rel_tol=1e-9), (N, s / sh[0])
    assert ps[-1] / sh[-1] > 100
    per = {N: {"up": 0.25, "down": 0.5, "reduce": 1.0} for N in Ns}
    exposed = {pat: [ddp_step(_net(4, 25), Wire("t", per), N, one, link, DDPExchange(pat))["exposed_comm"]
                     for N in Ns] for pat in ("ps", "sharded_ps")}
    assert exposed["ps"][-1] > 50 * exposed["ps"][0] and exposed["sharded_ps"][-1] < 1.5 * exposed["sharded_ps"][0]


@pytest.mark.parametrize("N", [2, 3, 4])
def test_sharded_ps_moves_the_real_modes_bits(N):
    """The sharded server's bytes through one link (one GPU per node, no latency), from compare time's
    measured TernGrad wire: each way (N-1)/N (2 + ceil(log2(2N+1))) bits per element (N = 2: 2.5,
    N = 3: 3.33, N = 4: 4.5; sent + received: twice that), within the headers; equal to the real
    mode's count (tgsim.exchange.sharded, in process: codes to N-1 owners, this owner's sums to N-1
    ranks, 8-byte block headers) within those headers; and the bench's block sizes
    (`perfmodel_emulation.sharded_blocks`) are the real mode's ShardPlan's, byte for byte."""
    from tgsim.analysis import compare_time as ct
    from tgsim.analysis.perfmodel_emulation import sharded_blocks

    n = 1 << 14
    w = math.ceil(math.log2(2 * N + 1))
    wire = ct.measure_wire(["terngrad"], workers=(N,), n=n).set_index("pattern")
    up, down = wire.loc["sharded_ps", ["up", "down"]]
    assert (up, down) == tuple(wire.loc["ps", ["up", "down"]])
    link = Link("no latency", 1e9, 0.0, 1.0)
    bits = ddp.sharded_ps(up * n, down * n, N, 1, link, link) * link.bandwidth / n     # each way, per element
    expect = (N - 1) / N * (2 + w)
    slack = 8 * 64 / n              # the message header, the scaler and its all-reduce: < 64 bytes
    assert expect <= bits <= expect + slack, (N, bits, expect)
    real = 8 * wire.loc["sharded_ps", "sent"]                   # rank 0's sent bits per element
    assert abs(real - bits) <= 8 * (2 * (N - 1) * 8 + 64) / n, (N, real, bits)
    assert abs(real - expect) <= 8 * (2 * (N - 1) * 8 + 64) / n
    sharded = pytest.importorskip("tgsim.exchange.sharded")
    plan = sharded.shard_plan(n, N, "2bit")
    assert sharded_blocks(n, N) == (list(plan.up), list(plan.down))


def test_scaler_allreduce_is_a_latency_and_a_dependency():
    """A codec sharing statistics pays, per bucket, an all-reduce of one float per layer: without overlap
    the step is longer by exactly Σ buckets scaler_allreduce(its layers); with overlap the encode waits
    for it, so the step is not shorter than without the scaler (and longer on a latency-bound link)."""
    G, hw, link = 64, HARDWARE["p100-fp32"], Link("1 Gb/s", 1e9, 5e-3)
    net, w = _net(40, 1), Wire("t", {G: {"up": 0.25, "down": 0.5, "reduce": 1.0}})
    ex = DDPExchange("ring", bucket_mb=25, overlap=False)
    a = ddp_step(net, w, G, hw, link, ex, shared_stats=True)
    b = ddp_step(net, w, G, hw, link, ex, shared_stats=False)
    scal = sum(ddp.scaler_allreduce(bk.layers, G, 4, link, hw.intra) for bk in ddp.buckets(net, 25))
    assert scal > 0 and math.isclose(a["iteration"] - b["iteration"], scal, rel_tol=1e-9)
    ov = DDPExchange("ring", bucket_mb=25)
    assert ddp_step(net, w, G, hw, link, ov, shared_stats=True)["iteration"] > \
        ddp_step(net, w, G, hw, link, ov, shared_stats=False)["iteration"]
    # the dependency: one bucket, ready when the backward ends; its encode (20 ms) starts only after the
    # scaler all-reduce, then the exchange: step = compute + scaler + encode + exchange
    one, cost = _net(1, 1), CodecCost(encode_floor=20e-3, source="host")
    r = ddp_step(one, w, G, hw, link, ov, cost, shared_stats=True)
    t_s = ddp.scaler_allreduce(1, G, 4, link, hw.intra)
    t_x, _ = ddp.collective(ov, w.layer_bytes(one.params, G), G, 4, link, hw.intra)
    assert math.isclose(r["iteration"], r["compute"] + t_s + 20e-3 + t_x, rel_tol=1e-9)


def test_codec_seconds_are_on_the_critical_path():
    """On a link fast enough to hide the exchange, a codec's encode and decode still lengthen the step
    by at least their sum (they take the GPU); with no codec cost the step is the compute (to 0.1 %:
    the last bucket's NVLink hops stay exposed)."""
    G, hw, link = 8, HARDWARE["p100-fp32"], Link("fast", 1e15, 0.0)
    net, w = _net(8, 10), Wire("t", {G: {"up": 0.25, "down": 0.5, "reduce": 1.0}})
    free = ddp_step(net, w, G, hw, link, DDPExchange("ring"))
    cost = CodecCost(encode=1e-9, decode=1e-9, source="host")
    paid = ddp_step(net, w, G, hw, link, DDPExchange("ring"), cost)
    assert math.isclose(free["iteration"], free["compute"], rel_tol=1e-3)
    assert paid["codec_seconds"] > 0 and paid["iteration"] >= free["compute"] + paid["codec_seconds"] - 1e-12


def test_codec_cost_floor_and_hardware_speed():
    c = CodecCost(encode=1e-12, encode_floor=1e-4, source="gpu")
    assert c.encode_seconds(10) == 1e-4 and math.isclose(c.encode_seconds(10 ** 9), 1e-3)
    net = _net(2, 1)
    p100, h100 = ddp.compute_seconds(net, HARDWARE["p100-fp32"]), ddp.compute_seconds(net, HARDWARE["h100-amp"])
    assert math.isclose(p100 / h100, HARDWARE["h100-amp"].speed)
    assert math.isclose(ddp.compute_seconds(net, HARDWARE["p100-fp32"], compute_speed=4.0), p100 / 4)


def test_bench_validation_predicts_the_allreduce_and_judges_within_20_percent():
    """fp32_native on N = 2 ranks of a 1 Gb/s switch: the ring all-reduce of 4P bytes, 2 (N-1)/N 4P
    bytes at 0.9 x 1 Gb/s + 2 latencies (the tree is not faster at N = 2). A row measured at the
    prediction is within 20 % (positive control); one measured at 2x it is not (negative control);
    shared-topology rows and unmodeled modes (tg_allgather) are left out."""
    from tgsim.analysis import perfmodel_ddp_validate as pv

    assert pv.rate_bits("10gbit") == 10e9 and pv.rate_bits("500mbit") == 500e6
    P, lat = 1_000_000, 50e-6
    pred = 8 * 4 * P / (0.9 * 1e9) + 2 * lat
    assert math.isclose(pv.predict_wire("fp32_native", P, 2, Link("1gbit", 1e9, lat), tbf=False), pred,
                        rel_tol=1e-12)
    rows = pd.DataFrame([dict(topology=t, rate="1gbit", ranks=2, params=P, mode=m, t_wire=w, t_exchange=w, t_step=w)
                         for t, m, w in (("switch", "fp32_native", pred), ("switch", "fp32_native", 2 * pred),
                                         ("shared", "fp32_native", pred), ("switch", "tg_allgather", pred))])
    v = pv.validate(rows, lat, tbf=False)
    assert len(v) == 2 and list(v.within) == [True, False] and list(v.scope) == ["link", "link"]
    np.testing.assert_allclose(v.ratio, [1.0, 0.5])


def test_bench_validation_compares_ps_rows_with_rank_0_and_sharded_rows_with_the_sharded_server():
    """Bench rows of tg_ps (the exchange's ps: rank 0's server, pipelined) are predicted by the pattern
    "ps" (`rank0_ps`) on its bench bytes: N-1 slots in, N-1 downlinks out; tg_ps_whole by the same server
    in one piece (in + out); tg_sharded_ps, or rows named as the exchange names the mode, "sharded_ps",
    by `sharded_ps` on its Alltoallv and Allgatherv buffers. Rank 0's prediction grows about linearly
    with N (N = 2 -> 8: more than 5x), the sharded one's less than 3x (its sums' width). A tg_ps row
    measured at the sharded prediction is not within 20 % (negative control)."""
    from tgsim.analysis import perfmodel_ddp_validate as pv
    from tgsim.analysis.perfmodel_emulation import bench_layer_sizes, mode_payloads, pieces

    P, lat = 4_000_000, 50e-6
    link = Link("1gbit", 1e9, lat)
    for N in (2, 4, 8):
        layers = len(bench_layer_sizes(P))
        sc = ddp.scaler_allreduce(layers, N, 1, link, link)
        pay = mode_payloads("tg_ps", bench_layer_sizes(P), N)
        assert math.isclose(pv.predict_wire("tg_ps", P, N, link, tbf=False),
                            sc + ddp.rank0_ps(pay["gather"], pay["bcast"], N, 1, link, link, pieces=pieces(P)),
                            rel_tol=1e-12)
        whole = mode_payloads("tg_ps_whole", bench_layer_sizes(P), N)
        assert math.isclose(pv.predict_wire("tg_ps_whole", P, N, link, tbf=False),
                            sc + link.seconds((N - 1) * (whole["gather"] + whole["bcast"])) + 2 * lat, rel_tol=1e-12)
        sh = mode_payloads("tg_sharded_ps", bench_layer_sizes(P), N)
        assert math.isclose(pv.predict_wire("tg_sharded_ps", P, N, link, tbf=False),
                            sc + link.seconds((N - 1) / N * (sh["alltoallv"] + sh["allgatherv"])) + 2 * lat,
                            rel_tol=1e-12)
        assert pv.predict_wire("sharded_ps", P, N, link) == pv.predict_wire("tg_sharded_ps", P, N, link)
    ps = [pv.predict_wire("tg_ps", P, N, link, tbf=False) for N in (2, 8)]
    sh = [pv.predict_wire("tg_sharded_ps", P, N, link, tbf=False) for N in (2, 8)]
    assert ps[1] > 5 * ps[0] and sh[1] < 3 * sh[0]
    pred = {m: pv.predict_wire(m, P, 8, link) for m in ("tg_ps", "tg_sharded_ps")}

    def rows(*pairs):
        return pd.DataFrame([dict(topology="switch", rate="1gbit", ranks=8, params=P, mode=m, t_wire=t, t_exchange=t,
                                  t_step=t) for m, t in pairs])

    v = pv.validate(rows(("tg_ps", pred["tg_ps"]), ("sharded_ps", pred["tg_sharded_ps"])), lat).set_index("mode")
    assert list(v.index) == ["tg_ps", "tg_sharded_ps"] and v.within.all()
    wrong = pv.validate(rows(("tg_ps", pred["tg_sharded_ps"])), lat)
    assert not wrong.within.any() and wrong.ratio.iloc[0] > 3


def test_bench_validation_counts_the_token_bucket_and_leaves_host_bound_rows_out():
    """netem.sh's tbf bucket (256 KiB at 1 Gb/s) passes at once: the all-reduce of 4P bytes on N = 2
    ranks takes 256 KiB x 8 / (0.9 x 1 Gb/s) less than the pure link time, and a message smaller than
    the bucket saves only its own bytes. The same point measured unshaped gives `host`: a shaped row
    whose host time exceeds 0.25 x its prediction is host-bound (shown, not counted); at 0.25 x it is
    still a link row (the boundary: a perfect link model plus that host time is 20 % off)."""
    from tgsim.analysis import perfmodel_ddp_validate as pv

    P, lat, link = 1_000_000, 50e-6, Link("1gbit", 1e9, 50e-6)
    pure = pv.predict_wire("fp32_native", P, 2, link, tbf=False)
    burst = 262144.0
    assert math.isclose(pv.predict_wire("fp32_native", P, 2, link), pure - 8 * burst / 0.9e9, rel_tol=1e-12)
    assert math.isclose(pv.tbf_saving(1000.0, burst, link), 8 * 1000 / 0.9e9, rel_tol=1e-12)
    assert pv.tbf_saving(1000.0, -5.0, link) == 0.0
    pred = pv.predict_wire("fp32_native", P, 2, link)

    def row(rate, ranks, t):
        return dict(topology="switch", rate=rate, ranks=ranks, params=P, mode="fp32_native", t_wire=t,
                    t_exchange=t, t_step=t)

    rows = pd.DataFrame([row("1gbit", 2, pred), row("none", 2, 0.25 * pred),
                         row("1gbit", 4, 1.0), row("none", 4, 0.2501 * pv.predict_wire("fp32_native", P, 4, link))])
    v = pv.validate(rows, lat).set_index("ranks")
    assert len(v) == 2 and (v.rate == "1gbit").all()
    assert v.loc[2, "scope"] == "link" and v.loc[2, "within"] and math.isclose(v.loc[2, "host"], 0.25 * pred)
    assert v.loc[4, "scope"] == pv.HOST_BOUND and not v.loc[4, "within"]
    assert pv.scope_of(1.0, math.nan) == "link"


# -- DDP over Gloo (`tgsim bench torch`): DDP's buckets, overlap, the shared loopback -------------------------------

def test_ddp_buckets_close_at_the_first_cap_then_at_bucket_cap():
    """Tensors (elements, MACs) in forward order, taken last first: 200k elements (800 KB) stay under
    the 1 MiB first cap, +100k reach 1.2 MB >= 1 MiB and close the first bucket at 3/4 of the MACs;
    the first 300k go into a 25 MiB bucket that is ready at the end of the backward pass."""
    from tgsim.analysis import perfmodel_ddp_validate as pv

    tensors = [(300_000, 1), (100_000, 1), (200_000, 2)]
    assert pv.ddp_buckets(tensors) == [(300_000, 0.75), (300_000, 1.0)]
    assert pv.ddp_buckets(tensors, first_mb=25.0) == [(600_000, 1.0)]       # one bucket: no overlap
    with pytest.raises(ValueError, match="bucket caps"):
        pv.ddp_buckets(tensors, bucket_mb=0)


def test_bench_resnet_tensors_are_the_torch_models():
    """`bench_resnet_tensors` lists the element count of every parameter tensor of
    tgsim.torch.examples.resnet, in its registration order (width 16, the default, and 80)."""
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")
    from tgsim.analysis import perfmodel_ddp_validate as pv
    from tgsim.torch.examples import resnet

    for width in (16, 80):
        model = resnet(64, 10, width=width)
        assert [e for e, _ in pv.bench_resnet_tensors(width)] == [p.numel() for p in model.parameters()]


def _torch_rows(width: int, rate: str, local: float, added: dict) -> list[dict]:
    from tgsim.analysis import perfmodel_ddp_validate as pv

    P = sum(e for e, _ in pv.bench_resnet_tensors(width))
    rows = [dict(rate=rate, variant="local", ranks=2, params=P, width=width, t_backward=local)]
    return rows + [dict(rate=rate, variant=v, ranks=2, params=P, width=width, t_backward=local + a)
                   for v, a in added.items()]


def test_validate_ddp_overlaps_buckets_on_the_shared_link_and_marks_unshaped_rows():
    """Width 80 (two DDP buckets) on 2 ranks sharing one 1 Gb/s loopback: each bucket of e elements
    is a ring all-reduce of 2 (N-1)/N x 4e bytes (fp16: 2e) at 0.9 x 1 Gb/s / 2 + 2 latencies; the
    first starts when the backward pass is `ready` through, the second at max(end of the backward
    pass, end of the first). A row measured at that is within 20 % (positive control), an fp16 row
    measured at twice its prediction is not (negative control); unshaped rows are out of scope."""
    from tgsim.analysis import perfmodel_ddp_validate as pv

    lat, W, B = 50e-6, 0.02, 1e9
    (e1, r1), (e2, r2) = pv.ddp_buckets(pv.bench_resnet_tensors(80))
    assert r2 == 1.0 and 0 < r1 < 1

    def ring(nbytes):
        return 8 * (2 * (2 - 1) / 2 * nbytes) / (0.9 * B / 2) + 2 * lat

    def exposed(width_bytes):
        first_end = r1 * W + ring(width_bytes * e1)
        return max(first_end, W) + ring(width_bytes * e2) - W

    fp32, fp16 = exposed(4), exposed(2)
    assert fp32 < ring(4 * e1) + ring(4 * e2)               # the overlap hides part of the first bucket
    rows = pd.DataFrame(_torch_rows(80, "1gbit", W, {"ddp_allreduce": fp32, "ddp_fp16": 2 * fp16})
                        + _torch_rows(80, "none", W, {"ddp_allreduce": 0.005}))
    v = pv.validate_ddp(rows, lat, tbf=False).set_index(["rate", "variant"])
    np.testing.assert_allclose(v.loc[("1gbit", "ddp_allreduce"), "pred"], fp32, rtol=1e-12)
    np.testing.assert_allclose(v.loc[("1gbit", "ddp_fp16"), "ratio"], 0.5, rtol=1e-12)
    assert v.loc[("1gbit", "ddp_allreduce"), "within"] and not v.loc[("1gbit", "ddp_fp16"), "within"]
    np.testing.assert_allclose(v.loc[("1gbit", "ddp_allreduce"), "pred_serial"], ring(4 * e1) + ring(4 * e2))
    out = v.loc[("none", "ddp_allreduce")]
    assert out.scope == pv.OUT_OF_SCOPE and math.isnan(out.pred) and not out.within
    assert (v.drop(index=[("none", "ddp_allreduce")]).scope == "link").all()
    # N = 4 ranks, one bucket (width 16): 2 (N-1)/N x 4P bytes at 0.9 x B / 4 + 2 (N-1) latencies
    rows4 = pd.DataFrame(_torch_rows(16, "1gbit", W, {"ddp_allreduce": 0.0})).assign(ranks=4)
    P = int(rows4.params.iloc[0])
    v4 = pv.validate_ddp(rows4, lat, tbf=False)
    np.testing.assert_allclose(v4.pred, [8 * (2 * 3 / 4 * 4 * P) / (0.9 * B / 4) + 6 * lat], rtol=1e-12)
    assert list(v4.buckets) == [1]


def test_ddp_token_bucket_refills_only_while_the_link_idles():
    """Two buckets on 2 ranks sharing one 1 Gb/s loopback with a tbf bucket of `burst` bytes: the first
    starts on a full bucket and saves min(burst, its 2 (N-1) S bytes) at the full rate; the second
    starts right after it (no idle time) and saves nothing when the first drained the bucket, but
    saves again after an idle gap long enough to refill it. The unshaped row of the same variant is
    the shaped rows' `host`; a host time above 0.25 x the prediction makes the row host-bound."""
    from tgsim.analysis import perfmodel_ddp_validate as pv

    lat, B, burst = 50e-6, 1e9, 262144.0
    link = Link("1gbit / 2", B / 2, lat)
    whole = Link("1gbit", B, lat)
    e = 1_000_000                                   # 4 MB per bucket: drains the bucket
    ring = pv.ring_allreduce(4 * e, 2, 1, link, link)
    back = [(e, 0.0), (e, 0.0)]                     # both ready at once: back to back
    got = pv.exposed_comm(back, 1e-9, 4, 2, link, burst=burst)
    np.testing.assert_allclose(got, 2 * ring - whole.seconds(burst) - 1e-9, rtol=1e-9)
    apart = [(e, 0.0), (e, 1.0)]                    # the second ready long after the first ended
    got = pv.exposed_comm(apart, 10.0, 4, 2, link, burst=burst)
    np.testing.assert_allclose(got, ring - whole.seconds(burst), rtol=1e-9)
    assert pv.exposed_comm(back, 1e-9, 4, 2, link) > pv.exposed_comm(back, 1e-9, 4, 2, link, burst=burst)
    W = 0.02
    rows = pd.DataFrame(_torch_rows(80, "1gbit", W, {"ddp_allreduce": 0.05})
                        + _torch_rows(80, "none", W, {"ddp_allreduce": 0.05}))
    v = pv.validate_ddp(rows, lat).set_index(["rate", "variant"])
    shaped = v.loc[("1gbit", "ddp_allreduce")]
    assert math.isclose(shaped.host, 0.05, rel_tol=1e-12) and shaped.scope == pv.HOST_BOUND and not shaped.within
    rows = pd.DataFrame(_torch_rows(80, "1gbit", W, {"ddp_allreduce": 0.05})
                        + _torch_rows(80, "none", W, {"ddp_allreduce": 0.001}))
    assert pv.validate_ddp(rows, lat).set_index(["rate", "variant"]).loc[("1gbit", "ddp_allreduce"), "scope"] == "link"


def test_validate_ddp_models_the_rows_input_shape():
    """Rows of `--input cifar10` (dim 3072, 3 channels: a 3-channel stem, 16x the MACs per example)
    are modelled with that ResNet: its parameters match and the first bucket is ready at the share of
    the backward MACs of that shape; without the dim and channels columns the rows are taken for
    digits and refused (params differ)."""
    from tgsim.analysis import perfmodel_ddp_validate as pv

    cifar = pv.bench_resnet_tensors(80, dim=3072, channels=3)
    P = sum(e for e, _ in cifar)
    assert P != sum(e for e, _ in pv.bench_resnet_tensors(80))
    assert sum(m for _, m in cifar) > 15 * sum(m for _, m in pv.bench_resnet_tensors(80))
    rows = pd.DataFrame([dict(rate="1gbit", variant=v, ranks=2, params=P, width=80, dim=3072, channels=3,
                              t_backward=0.2 + a) for v, a in (("local", 0.0), ("ddp_allreduce", 0.05))])
    v = pv.validate_ddp(rows, tbf=False)
    (e1, r1), (e2, _) = pv.ddp_buckets(cifar)
    lat = 50e-6

    def ring(nbytes):
        return 8 * (2 * (2 - 1) / 2 * nbytes) / (0.9 * 1e9 / 2) + 2 * lat

    expect = max(r1 * 0.2 + ring(4 * e1), 0.2) + ring(4 * e2) - 0.2
    np.testing.assert_allclose(v["pred"].iloc[0], expect, rtol=1e-12)
    with pytest.raises(ValueError, match="not the bench ResNet"):
        pv.validate_ddp(rows.drop(columns=["dim", "channels"]))


def test_validate_ddp_refuses_rows_it_cannot_model(tmp_path, monkeypatch):
    """No local row at a rate, params not the bench ResNet's, missing columns: ValueError naming the
    problem; `tgsim analyze perfmodel-validate --torch-csv` prints and writes the table (no bench
    exchange CSV needed), exit 2 with one line for a missing file."""
    from tgsim.analysis import perfmodel_ddp_validate as pv
    from tgsim.cli import main

    rows = pd.DataFrame(_torch_rows(16, "1gbit", 0.02, {"ddp_allreduce": 0.01}))
    with pytest.raises(ValueError, match="no 'local' row"):
        pv.validate_ddp(rows[rows.variant != "local"])
    with pytest.raises(ValueError, match="not the bench ResNet"):
        pv.validate_ddp(rows.assign(params=rows.params + 1))
    with pytest.raises(ValueError, match="missing columns"):
        pv.validate_ddp(rows.drop(columns="width"))
    monkeypatch.chdir(tmp_path)
    rows.to_csv("bt.csv", index=False)
    assert main(["analyze", "perfmodel-validate", "--torch-csv", "bt.csv", "--out", "out"]) == 0
    assert len(pd.read_csv(tmp_path / "out" / "perfmodel_ddp_torch.csv")) == 1
    assert main(["analyze", "perfmodel-validate", "--torch-csv", "missing.csv", "--out", "out"]) == 2


def test_bench_torch_width_reaches_the_rank_program(capsys):
    """`tgsim bench torch --width W` passes --width W to every rank (default 16); a width the ResNet's
    GroupNorm cannot split is refused (exit 2) before anything runs."""
    from tgsim.bench import torch_ddp as bt

    job = bt.command("1gbit", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1, width=80)
    assert job[job.index("--width") + 1] == "80"
    job = bt.command("none", 2, bt.Path("raw.csv"), bt.Path("store"), 3, 1)
    assert job[job.index("--width") + 1] == "16"
    parser = bt.argparse.ArgumentParser()
    bt.add_arguments(parser)
    assert parser.parse_args([]).width == 16
    assert bt.cmd(parser.parse_args(["--width", "6"])) == 2
    assert "--width must be" in capsys.readouterr().err
