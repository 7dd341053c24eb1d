"""tgsim: TernGrad (Wen et al., NIPS 2017) and its peers.

One codec, three places it runs: the in-process simulator of N virtual workers, the MPI exchange,
and the statistical analysis. See README.md and docs/THEORY.md.
"""

__version__ = "0.1.0"
