"""Entry points for real multi-process runs: `mpiexec -n N python -m mpi_runs.train CONFIG.toml`."""
