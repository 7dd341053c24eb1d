#!/bin/bash
# Slurm template: one MPI rank (= one TernGrad worker) per GPU, launched with srun.
#
#   sbatch slurm_job.sh CONFIG.toml [OUT_DIR]       # CONFIG: a TOML path, or a built-in name (demo)
#
# Copy it from the installed package to the job directory and edit the #SBATCH lines:
#   cp "$(python -c 'import tgsim.mpi_runs, os; print(os.path.dirname(tgsim.mpi_runs.__file__))')/slurm_job.sh" .
# [workers] n in CONFIG.toml must equal nodes x tasks-per-node (8 below). The job cds to the submit
# directory; OUT_DIR must be on a filesystem every node sees, and so must the venv (TGSIM_VENV,
# default ./.venv), which holds tgsim installed (a wheel, `pip install git+...` or editable).
# Rank 0 prints one progress line every run.log_every steps to the job's output file.
# A requeued or re-submitted job with the same OUT_DIR resumes from its newest good checkpoint and
# ends with the bits of an uninterrupted run.
#
#SBATCH --job-name=tgsim
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4          # = GPUs per node
#SBATCH --gpus-per-node=4            # or: --gres=gpu:4 on older Slurm
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --output=%x-%j.out
#SBATCH --requeue

set -euo pipefail

CONFIG=${1:?usage: sbatch slurm_job.sh CONFIG.toml [OUT_DIR]}
OUT=${2:-results/${SLURM_JOB_NAME}-${SLURM_JOB_ID}}

cd "${SLURM_SUBMIT_DIR}"

# The MPI library mpi4py was built against (see mpi_runs/README.md), CUDA, and the venv.
# module load openmpi/4.1-cuda cuda/12.4          # site specific
source "${TGSIM_VENV:-.venv}/bin/activate"

export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK}
export NUMBA_NUM_THREADS=${SLURM_CPUS_PER_TASK}
# Device buffers straight to MPI when the library is CUDA-aware (probed; force with 1, disable with 0).
# export TGSIM_MPI_CUDA_AWARE=1
# export OMPI_MCA_opal_cuda_support=true          # Open MPI builds that need it switched on
# export MPICH_GPU_SUPPORT_ENABLED=1              # Cray MPICH
# export MPIR_CVAR_ENABLE_GPU=1                   # MPICH

RESUME=()
if [ -d "${OUT}/checkpoints" ]; then
    RESUME=(--resume)
fi

# Every task sees all GPUs of its node; tgsim picks GPU (node-local rank mod GPUs). With
# --gpus-per-task=1 instead, each task sees one GPU and picks it. --kill-on-bad-exit ends the whole
# job when one rank dies, so no rank waits forever in a collective. --mpi=pmix connects srun to
# Open MPI 5 and to MPICH built with PMIx; set SRUN_MPI=pmi2 (or what `srun --mpi=list` offers) for
# another. Without it every task starts as a rank 0 of size 1: tgsim.mpi_runs.train stops with a one-line
# error saying so (tgsim/exchange/mpi_env.py).
srun --mpi="${SRUN_MPI:-pmix}" --kill-on-bad-exit=1 --cpu-bind=cores \
    python -m tgsim.mpi_runs.train "${CONFIG}" --out "${OUT}" "${RESUME[@]}"
