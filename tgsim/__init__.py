"""tgsim: TernGrad (Wen et al., NIPS 2017) and its peers.

One codec, three places it runs: the in-process simulator of N virtual workers, the MPI exchange,
and the statistical analysis. See README.md and docs/THEORY.md.

Importing tgsim sets OMP_WAIT_POLICY=PASSIVE in this process's environment unless it is already set
(so before Numba's OpenMP threading layer starts, and for the ranks and workers it launches): with
GNU OpenMP's default, every thread of a parallel region spins for up to 300,000 iterations after
the region ends, and on a shared or oversubscribed node (ranks or test workers that together hold
more threads than cores) the spinning threads take the cores the other processes' work needs
(README, "Threads"). Set OMP_WAIT_POLICY=ACTIVE before importing tgsim to keep the spinning. The
bits never depend on it.
"""

import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
