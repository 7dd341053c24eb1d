"""Entry points for real multi-process runs: `mpiexec -n N python -m tgsim.mpi_runs.train CONFIG.toml`."""
