"""Benchmarks that print ratios measured in one run (`tgsim bench codec | sim | exchange`).

  timing         the one timing helper: named variants in interleaved rounds, warm-up calls untimed
  codec          fused codec kernels against the array reference and memory-bandwidth floors
  sim            the N-worker simulated step against a per-worker loop and its one-process floor
  exchange       the MPI exchange modes over an emulated network (drives netem.sh)
  exchange_rank  the program each MPI rank runs under netem.sh (`python -m tgsim.bench.exchange_rank`)
  netem.sh       package data: a private network namespace with a shaped link, mpiexec inside it

Importing this package imports none of them.
"""
