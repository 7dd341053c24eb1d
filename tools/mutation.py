"""Mutation testing for tgsim: does the test suite notice a wrong operator, constant or comparison?

    python tools/mutation.py                        # every target below (`make mutation`)
    python tools/mutation.py tgsim/train/optim.py   # one module (any path in TARGETS)
    python tools/mutation.py --list tgsim/train/optim.py    # the mutants, without running tests

Why not mutmut: mutmut 3 (the current one) copies the sources to mutants/ and names each mutant
after the file's path, but `analysis/` is installed as `tgsim.analysis` (an editable-install
mapping), so its trampolines record `tgsim.analysis.X` while mutmut looks for `analysis.X`, and
`tgsim.analysis` would still be imported from the unmutated tree. It also rewrites every function
into a trampoline, which the Numba @njit kernels do not survive. This runner is small instead:

* Mutants: one AST change at a time (like mutmut's operators): + - * / // % ** << >> & | ^
  swapped; < <= > >= == != is / is not / in / not in swapped; and <-> or; `not x` -> `x`, `-x` ->
  `x`; int n -> n+1, float x -> x+1 (0.0 -> 1.0), True <-> False;
  strings -> "XX"+s+"XX"; `break` <-> `continue`; a call statement (`f(...)`) -> `pass`;
  augmented assignment operators swapped. Not mutated: docstrings, type annotations and Literal[...] types, the text
  of exception messages and warnings (wording that no test pins by design), `__all__`.
* Each module's mutants run against that module's test selection (TARGETS), in a copy of the
  repository under the work directory (tgsim/, analysis/ and tests/, with tgsim/analysis a link
  to analysis/ so that `import tgsim.analysis` finds the copy and not the editable install).
* A traced run of the selection first records which tests execute which line of the module; a
  mutant runs only the tests that execute its line, fastest first, with `-x`; a mutant on a line
  no test executes is reported as "uncovered" (it survives without running anything); one on a
  line that runs at import (module constants, class bodies, defaults) runs the fastest 12 tests
  that execute some line of the module, and every test marked `mutation` that does
  ("at import" = before the first test: a module first imported inside a test has its
  module-level lines counted as that test's, so test files import their targets at the top).
* The tests written to kill survivors carry the marker `mutation` and live in the test file of
  the module they test (MUTANT_TESTS lists those files). Every module's selection is its TARGETS
  files plus the `mutation` tests of the other MUTANT_TESTS files (the plugin
  tools/mutation_trace.py deselects their unmarked tests); --no-mutant-tests deselects every
  `mutation` test (the score before they were written).
* The MPI exchange (tgsim/exchange/mpi.py, mpi_pipelined.py, mpi_transport.py) is scored
  in-process: tests/test_mpi_exchange.py drives MPIExchange over a fake communicator (one
  thread per rank). Lines that run only inside `mpiexec` children (tests/test_mpi.py) are not
  traced, so those tests are not in any selection; CuPy-only lines are covered by stand-ins or not.
* Each mutant's pytest is a fork of this process, which has imported numpy, scipy, pandas,
  numba and pytest once (but never tgsim), so no mutant pays those imports again.
* killed: a test failed or errored (or the run timed out: 3x the traced time + 20 s);
  survived: all the tests that execute the line passed.
* One pytest process at a time (no parallel workers).
* nvcc: tests/test_cuda_kernels.py builds the host harness (and the PTX) once per pytest session,
  so once per mutant. The runner puts a caching `nvcc` first on PATH
  (<workdir>/bin/nvcc): it keys the output on the real compiler, the arguments (the -o path
  aside) and the text of the input file and of every .cu/.cuh/.h file beside it, runs the real nvcc
  on a miss and copies the stored output on a hit. A mutant of a .py file changes no input, so
  the harness is compiled once; a mutant of the module source (cuda.source()) changes the PTX
  input and is compiled anew. The normal test suite never sees the shim.

Results: <workdir>/results.json and a table of survivors on stdout. Exit status 0 always (the
score is a report, not a gate); --fail-under P makes it 1 below P %.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Module -> the fast tests that exercise it. Numba @njit modules are not targets (see README):
# tgsim/codecs/terngrad/numba_*.py, tgsim/codecs/_numba_uint.py, tgsim/exchange/_numba_mean.py,
# tgsim/rng/numba_philox.py, tgsim/train/layer_stats.py; tests/test_numba_kernels.py checks them
# bit for bit against the NumPy reference modules, which are targets here.
CODEC_TESTS = ["tests/test_codec_contract.py", "tests/test_golden.py", "tests/test_packing_uint.py",
               "tests/test_numba_kernels.py", "tests/test_statistics.py", "tests/test_bad_input.py",
               "tests/test_batched_codec.py"]
EXCHANGE_TESTS = ["tests/test_exchange_oracle.py", "tests/test_pieces.py", "tests/test_mpi_errors.py"]
MPI_UNIT_TESTS = ["tests/test_mpi_errors.py", "tests/test_pieces.py"]   # no mpiexec launch
# The files that hold tests marked `mutation` (written to kill surviving mutants).
MUTANT_TESTS = ["tests/test_bf16.py", "tests/test_codecs_base.py", "tests/test_elias.py",
                "tests/test_error_feedback.py", "tests/test_exchange_base.py", "tests/test_fp16.py",
                "tests/test_fp32.py", "tests/test_framing.py", "tests/test_inprocess.py",
                "tests/test_message.py", "tests/test_mpi_env.py", "tests/test_mpi_errors.py",
                "tests/test_mpi_exchange.py", "tests/test_mpi_exchange_errors.py",
                "tests/test_mpi_transport.py", "tests/test_optim.py",
                "tests/test_ordered_mean.py", "tests/test_packing.py", "tests/test_pieces.py",
                "tests/test_ps_downlink.py", "tests/test_qsgd.py", "tests/test_registry.py",
                "tests/test_sign.py", "tests/test_sparse.py", "tests/test_suresh.py",
                "tests/test_terngrad_codec.py", "tests/test_terngrad_cuda.py",
                "tests/test_terngrad_kernels.py", "tests/test_terngrad_moments.py",
                "tests/test_terngrad_quantizer.py", "tests/test_terngrad_reference.py",
                "tests/test_unbiasedness.py"]
TARGETS: dict[str, list[str]] = {
    "tgsim/train/optim.py": ["tests/test_optim_oracles.py", "tests/test_run_oracle.py"],
    "analysis/unbiasedness.py": ["tests/test_statistics.py", "tests/test_analysis.py",
                                 "tests/test_pooled_bias.py"],
    "tgsim/codecs/packing.py": CODEC_TESTS,
    "tgsim/codecs/message.py": CODEC_TESTS + EXCHANGE_TESTS,
    "tgsim/codecs/framing.py": CODEC_TESTS + EXCHANGE_TESTS,
    "tgsim/codecs/ordered_mean.py": CODEC_TESTS + EXCHANGE_TESTS,
    "tgsim/codecs/terngrad/quantizer.py": CODEC_TESTS,
    "tgsim/codecs/terngrad/reference.py": CODEC_TESTS,
    "tgsim/codecs/terngrad/moments.py": CODEC_TESTS,
    "tgsim/codecs/terngrad/codec.py": CODEC_TESTS,
    "tgsim/codecs/base.py": CODEC_TESTS + ["tests/test_registry.py", "tests/test_gpu_backend.py"],
    "tgsim/exchange/base.py": EXCHANGE_TESTS + ["tests/test_batched_step.py"],
    "tgsim/exchange/inprocess.py": EXCHANGE_TESTS + ["tests/test_batched_step.py"],
    "tgsim/exchange/ps_downlink.py": EXCHANGE_TESTS + ["tests/test_batched_step.py"],
    "tgsim/exchange/pieces.py": EXCHANGE_TESTS,
    "tgsim/exchange/mpi_errors.py": EXCHANGE_TESTS,
    # The MPI exchange in-process: tests/test_mpi_exchange.py drives MPIExchange with a fake
    # communicator (one thread per rank). Lines that run only inside `mpiexec` children
    # (tests/test_mpi.py) are not traced, so those tests are not in the selection.
    "tgsim/exchange/mpi.py": MPI_UNIT_TESTS,
    "tgsim/exchange/mpi_transport.py": MPI_UNIT_TESTS,
    "tgsim/exchange/mpi_pipelined.py": MPI_UNIT_TESTS,
    "tgsim/exchange/mpi_env.py": ["tests/test_mpi_env.py"],
    "tgsim/codecs/error_feedback.py": ["tests/test_error_feedback.py"],
    "tgsim/codecs/qsgd.py": ["tests/test_peer_qsgd.py", "tests/test_peer_numba_kernels.py",
                             "tests/test_codec_contract.py"],
    "tgsim/codecs/sign.py": ["tests/test_peer_sign_bf16.py", "tests/test_peer_numba_kernels_more.py",
                             "tests/test_codec_contract.py", "tests/test_error_feedback.py"],
    "tgsim/codecs/sparse.py": ["tests/test_peer_sparse.py", "tests/test_peer_numba_kernels_more.py",
                               "tests/test_codec_contract.py", "tests/test_bad_input.py"],
    "tgsim/codecs/suresh.py": ["tests/test_peer_suresh.py", "tests/test_peer_numba_kernels.py",
                               "tests/test_codec_contract.py"],
    "tgsim/codecs/fp16.py": ["tests/test_peer_numba_kernels_more.py", "tests/test_registry.py",
                             "tests/test_codec_contract.py"],
    "tgsim/codecs/bf16.py": ["tests/test_peer_sign_bf16.py", "tests/test_peer_numba_kernels_more.py",
                             "tests/test_codec_contract.py"],
    "tgsim/codecs/elias.py": ["tests/test_peer_qsgd.py", "tests/test_peer_numba_kernels.py"],
    "tgsim/codecs/fp32.py": ["tests/test_codec_contract.py", "tests/test_registry.py", "tests/test_golden.py"],
    "tgsim/codecs/registry.py": ["tests/test_registry.py", "tests/test_codec_contract.py"],
    # The CuPy wrapper of the CUDA kernels, on the CPU: TestWrapperOnHostHarness runs it against a
    # stand-in `cupy` whose kernels are the nvcc-built host harness (see the nvcc note above).
    # TestWrapperOnGPU is skipped without a GPU: lines only it reaches are tool-limit survivors.
    "tgsim/codecs/terngrad/cuda.py": ["tests/test_cuda_kernels.py", "tests/test_cupy_api.py"],
    # the choice of kernel set: the codec's tests call get_kernels through TernGrad.kernels_for
    "tgsim/codecs/terngrad/kernels.py": ["tests/test_batched_codec.py", "tests/test_codec_contract.py",
                                         "tests/test_numba_kernels.py", "tests/test_cuda_kernels.py"],
}
# -k filters for selections that would otherwise run slow, unrelated tests.
# (the codec-level Monte Carlo tests of test_statistics.py are slow and call unbiasedness.py
# only through the same few lines the direct tests in test_analysis.py cover)
SELECT: dict[str, str] = {
    "analysis/unbiasedness.py": "not unbiased_without_clipping and not scaler_sharing_each_worker",
    # the contract's registered-codec cases of the other codecs, and the MPI run, never reach qsgd.py
    "tgsim/codecs/qsgd.py": "(qsgd or QSGD) and not mpi",
}

IMPORT_LINE_TESTS = 12
PYTEST = ["-p", "no:cacheprovider", "-q", "-x", "--no-header", "-o", "addopts=", "-W", "ignore",
          "-p", "no:randomly"]
NOT_MUTATED_CALLS = {"warn", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError",
                     "NotImplementedError", "AssertionError", "OverflowError", "AttributeError"}


@dataclass
class Mutant:
    module: str
    index: int          # position of the node in ast.walk order
    variant: int
    line: int
    kind: str
    before: str
    after: str
    status: str = "pending"     # killed | survived | uncovered | timeout | invalid
    seconds: float = 0.0
    killed_by: str = ""
    tests_run: int = 0


# ---------------------------------------------------------------------------------- mutants

_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
               ast.FloorDiv: ast.Div, ast.Mod: ast.Mult, ast.Pow: ast.Mult, ast.LShift: ast.RShift,
               ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
               ast.BitXor: ast.BitOr, ast.MatMult: ast.Mult}
_CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
             ast.NotIn: ast.In}


def _skip_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, exception/warning text, __all__."""
    skip: set[int] = set()

    def all_under(node):
        for n in ast.walk(node):
            skip.add(id(n))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                all_under(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.returns is not None:
                all_under(node.returns)
            for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs \
                    + [node.args.vararg, node.args.kwarg]:
                if a is not None and a.annotation is not None:
                    all_under(a.annotation)
        if isinstance(node, ast.AnnAssign):
            all_under(node.annotation)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            all_under(node)
        if isinstance(node, ast.Raise) and node.exc is not None:
            # the message text, not the exception type or the values formatted into it
            for n in ast.walk(node.exc):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    skip.add(id(n))
                if isinstance(n, ast.JoinedStr):
                    skip.add(id(n))
        if isinstance(node, ast.Call):
            fname = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else ""
            if fname in NOT_MUTATED_CALLS:
                for n in ast.walk(node):
                    if isinstance(n, ast.Constant) and isinstance(n.value, str):
                        skip.add(id(n))
        if isinstance(node, ast.JoinedStr):
            for n in ast.walk(node):
                skip.add(id(n))   # f-string pieces: formatting, not logic
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            all_under(node)   # typing.Literal["a", "b"]: a type, not a value
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            all_under(node)
    return skip


def _variants(node: ast.AST, parents: dict[int, ast.AST]) -> list[tuple[str, callable]]:
    """(kind, apply) pairs; apply(node) mutates a deep copy of the node in place."""
    out = []
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
        new = _BINOP_SWAP[type(node.op)]
        out.append((f"binop {type(node.op).__name__}->{new.__name__}",
                    lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP:
        new = _BINOP_SWAP[type(node.op)]
        out.append((f"augassign {type(node.op).__name__}->{new.__name__}",
                    lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP_SWAP:
                new = _CMP_SWAP[type(op)]

                def apply(n, i=i, new=new):
                    n.ops[i] = new()
                out.append((f"compare {type(op).__name__}->{new.__name__}", apply))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        out.append((f"boolop ->{new.__name__}", lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        out.append((f"drop unary {type(node.op).__name__}", "unwrap"))
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            out.append(("bool flip", lambda n: setattr(n, "value", not n.value)))
        elif isinstance(v, int):
            out.append(("int n->n+1", lambda n: setattr(n, "value", n.value + 1)))
        elif isinstance(v, float):
            out.append(("float x->x+1", lambda n: setattr(n, "value", n.value + 1.0)))
        elif isinstance(v, str):
            out.append(("string", lambda n: setattr(n, "value", "XX" + n.value + "XX")))
    elif isinstance(node, ast.Break):
        out.append(("break->continue", "continue"))
    elif isinstance(node, ast.Continue):
        out.append(("continue->break", "break"))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        out.append(("call statement->pass", "pass"))
    return out


def _src(node: ast.AST, source: str) -> str:
    seg = ast.get_source_segment(source, node) or ast.unparse(node)
    return " ".join(seg.split())[:120]


def mutants_of(module: str, source: str) -> list[tuple[Mutant, str]]:
    """Every mutant of one module, with its full mutated source."""
    tree = ast.parse(source)
    base = ast.dump(tree)
    skip = _skip_nodes(tree)
    nodes = list(ast.walk(tree))
    parents = {id(c): p for p in nodes for c in ast.iter_child_nodes(p)}
    out = []
    for index, node in enumerate(nodes):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        for variant, (kind, apply) in enumerate(_variants(node, parents)):
            t2 = copy.deepcopy(tree)
            n2 = list(ast.walk(t2))[index]
            if apply == "unwrap":
                repl = n2.operand
            elif apply in ("pass", "continue", "break"):
                repl = {"pass": ast.Pass, "continue": ast.Continue, "break": ast.Break}[apply]()
            else:
                apply(n2)
                repl = n2
            if repl is not n2:
                if not _replace(t2, n2, repl):
                    continue
            ast.fix_missing_locations(t2)
            try:
                new_source = ast.unparse(t2)
                compile(new_source, module, "exec")
            except (SyntaxError, ValueError):
                continue
            if ast.dump(ast.parse(new_source)) == base:
                continue
            out.append((Mutant(module, index, variant, node.lineno, kind, _src(node, source),
                               " ".join(ast.unparse(repl).split())[:120]), new_source))
    return out


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> bool:
    for parent in ast.walk(tree):
        for fname, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, fname, new)
                return True
            if isinstance(value, list):
                for i, v in enumerate(value):
                    if v is old:
                        value[i] = new
                        return True
    return False


# ---------------------------------------------------------------------------------- running

def make_tree(work: Path) -> Path:
    """A copy of the repository's code and tests in which tgsim and tgsim.analysis import."""
    tree = work / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    ignore = shutil.ignore_patterns(".hypothesis", ".pytest_cache")
    for name in ("tgsim", "analysis", "tests", "tools"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore, symlinks=True)  # keeps mtimes:
    for name in ("pyproject.toml", "README.md", "Makefile", "constraints.txt"):     # Numba cache hits
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, tree / name)
    for name in ("docs", "mpi_runs", "papers_figures"):
        if (ROOT / name).exists():
            os.symlink(ROOT / name, tree / name)
    os.symlink("../analysis", tree / "tgsim" / "analysis")
    _nvcc_shim(work)
    check = subprocess.run([sys.executable, "-c", "import tgsim, tgsim.analysis, os; "
                            "print(os.path.realpath(tgsim.__file__)); "
                            "print(os.path.realpath(tgsim.analysis.__file__))"],
                           cwd=tree, env=_env(tree), capture_output=True, text=True, check=True)
    for line in check.stdout.split():
        if not line.startswith(str(tree.resolve())):
            sys.exit(f"the copy does not shadow the installed package: {line}")
    return tree


NVCC_SHIM = '''#!{python}
"""nvcc with an output cache (written by tools/mutation.py; see its docstring)."""
import hashlib, os, shutil, subprocess, sys
REAL, CACHE = {real!r}, {cache!r}
args = sys.argv[1:]
out = args[args.index("-o") + 1] if "-o" in args[:-1] else None
src = args[-1] if args and args[-1].endswith(".cu") and os.path.isfile(args[-1]) else None
if out is None or src is None:
    os.execv(REAL, [REAL, *args])
h = hashlib.sha256()
st = os.stat(REAL)
h.update(repr((REAL, st.st_size, st.st_mtime_ns, [a if a != out else "<out>" for a in args])).encode())
folder = os.path.dirname(os.path.abspath(src))
names = sorted(f for f in os.listdir(folder) if f.endswith((".cu", ".cuh", ".h")))
for f in [src] + [os.path.join(folder, f) for f in names]:
    h.update(f.encode() if f == src else os.path.basename(f).encode())
    with open(f, "rb") as fh:
        h.update(fh.read())
stored = os.path.join(CACHE, h.hexdigest())
if os.path.exists(stored):
    shutil.copyfile(stored, out)
    sys.exit(0)
rc = subprocess.run([REAL, *args]).returncode
if rc == 0 and os.path.exists(out):
    os.makedirs(CACHE, exist_ok=True)
    tmp = stored + ".%d.tmp" % os.getpid()
    shutil.copyfile(out, tmp)
    os.replace(tmp, stored)
sys.exit(rc)
'''


def _nvcc_shim(work: Path) -> None:
    """<work>/bin/nvcc: the caching nvcc (module docstring); nothing when nvcc is not on PATH."""
    bindir = work.resolve() / "bin"
    shim = bindir / "nvcc"
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if Path(p or ".").resolve() != bindir)
    real = shutil.which("nvcc", path=path)
    if real is None:
        return
    bindir.mkdir(parents=True, exist_ok=True)
    shim.write_text(NVCC_SHIM.format(python=sys.executable, real=os.path.realpath(real),
                                     cache=str(work.resolve() / "nvcc_cache")))
    shim.chmod(0o755)


def _env(tree: Path) -> dict:
    env = dict(os.environ)
    shim = (tree.parent / "bin" / "nvcc").resolve()
    if shim.exists() and not env.get("PATH", "").startswith(str(shim.parent) + os.pathsep):
        env["PATH"] = str(shim.parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "tools")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("TGSIM_SLOW", None)
    return env


def trace(tree: Path, module: str, tests: list[str], work: Path, marked_only: list[str] = (),
          drop_marked: bool = False) -> dict:
    """Run the selection once under tools/mutation_trace.py: which test executes which line.

    marked_only: files of which only the tests marked `mutation` run; drop_marked: deselect every
    `mutation` test."""
    out = work / ("trace_" + module.replace("/", "_") + ".json")
    env = _env(tree)
    env["MUTATION_MARKED_ONLY"] = os.pathsep.join(marked_only)
    env["MUTATION_DROP_MARKED"] = "1" if drop_marked else ""
    env["MUTATION_TRACE_FILE"] = str((tree / module).resolve())
    env["MUTATION_TRACE_OUT"] = str(out)
    cmd = [sys.executable, "-m", "pytest", *PYTEST, "-p", "mutation_trace", *tests]
    if module in SELECT:
        cmd += ["-k", SELECT[module]]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the unmutated tests fail for {module} (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    data = json.loads(out.read_text())
    data["seconds"] = time.perf_counter() - t0
    return data


def run_mutant(tree: Path, m: Mutant, new_source: str, traced: dict) -> None:
    lines_by_test = traced["tests"]
    if m.line in traced["import"]:
        # module-level code (constants, class bodies, defaults) runs at import, before any test:
        # the fastest IMPORT_LINE_TESTS tests of the selection stand for all of them, together with
        # every test written to kill mutants (marker `mutation`), whatever its speed
        users = [t for t in lines_by_test if lines_by_test[t]["lines"]]
        fastest = sorted(users, key=lambda t: lines_by_test[t]["duration"])[:IMPORT_LINE_TESTS]
        tests = fastest + [t for t in users if lines_by_test[t].get("mutation") and t not in fastest]
    else:
        tests = sorted((t for t, v in lines_by_test.items() if m.line in v["lines"]),
                       key=lambda t: lines_by_test[t]["duration"])
    if not tests:
        m.status = "uncovered"
        return
    budget = 3 * sum(lines_by_test[t]["duration"] for t in tests) + 20
    path = tree / m.module
    original = path.read_bytes()
    stat = path.stat()
    t0 = time.perf_counter()
    try:
        path.write_text(new_source)
        rc, m.killed_by = _pytest_forked(tree, tests, budget)
        m.status = "survived" if rc == 0 else "timeout" if rc == "timeout" else "killed"
        m.tests_run = len(tests)
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    m.seconds = time.perf_counter() - t0


_PRELOADED = False


def _preload(tree: Path) -> None:
    """Import the heavy third-party modules once; each mutant's pytest runs in a fork of this
    process (tgsim itself is never imported here, so every fork imports the mutated file)."""
    global _PRELOADED
    if _PRELOADED:
        return
    os.chdir(tree)
    os.environ.update({k: v for k, v in _env(tree).items() if k != "PYTHONPATH"})
    os.environ.pop("TGSIM_SLOW", None)
    sys.path[:0] = [str(tree), str(tree / "tools")]
    import numba, numpy, pandas, pytest, scipy.stats  # noqa: F401,E401
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        pass
    _PRELOADED = True


def _pytest_forked(tree: Path, tests: list[str], budget: float) -> tuple[object, str]:
    """pytest on `tests` in a forked child; (exit code or "timeout", first failing test)."""
    _preload(tree)
    log = tree / ".mutation_pytest.log"
    pid = os.fork()
    if pid == 0:  # child
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            import pytest
            code = int(pytest.main([*PYTEST, *tests]))
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            code = 3
        os._exit(code)
    deadline = time.monotonic() + budget
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return "timeout", ""
            time.sleep(0.02)
    except BaseException:
        os.kill(pid, 9)   # stopped (Ctrl-C, SIGTERM): no orphaned child
        os.waitpid(pid, 0)
        raise
    rc = os.waitstatus_to_exitcode(status)
    failed = [ln.split(" ")[1] for ln in log.read_text(errors="replace").splitlines()
              if ln.startswith(("FAILED ", "ERROR "))]
    return rc, failed[0] if failed else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help="modules to mutate (default: all in TARGETS)")
    ap.add_argument("--workdir", default="/tmp/tgsim-mutation", help="copy of the repo + results")
    ap.add_argument("--list", action="store_true", help="print the mutants and stop")
    ap.add_argument("--lines", default="", help="only mutants on these lines, e.g. 10-40,55")
    ap.add_argument("--no-mutant-tests", action="store_true",
                    help="leave out the tests marked `mutation` (the score before they were written)")
    ap.add_argument("--fail-under", type=float, default=None)
    args = ap.parse_args(argv)

    modules = args.modules or list(TARGETS)
    for mod in modules:
        if mod not in TARGETS:
            sys.exit(f"{mod} is not a target; targets: {', '.join(TARGETS)}")
    wanted = None
    if args.lines:
        wanted = set()
        for part in args.lines.split(","):
            a, _, b = part.partition("-")
            wanted.update(range(int(a), int(b or a) + 1))

    work = Path(args.workdir)
    all_mutants: dict[str, list[tuple[Mutant, str]]] = {}
    for mod in modules:
        ms = mutants_of(mod, (ROOT / mod).read_text())
        if wanted is not None:
            ms = [(m, s) for m, s in ms if m.line in wanted]
        all_mutants[mod] = ms
    if args.list:
        for mod, ms in all_mutants.items():
            for m, _ in ms:
                print(f"{mod}:{m.line}  {m.kind:28s} {m.before!r} -> {m.after!r}")
        print(sum(len(v) for v in all_mutants.values()), "mutants")
        return 0

    signal.signal(signal.SIGTERM, _stop)
    t_start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    tree = make_tree(work)
    results: list[Mutant] = []
    try:
        _run_modules(modules, all_mutants, tree, work, results, args)
    except KeyboardInterrupt:
        print("\nstopped: the table covers the mutants run so far", flush=True)
    print(report(results))
    print(f"\n{time.perf_counter() - t_start:.0f} s; results in {work / 'results.json'}")
    score = _score(results)
    if args.fail_under is not None and score[2] < args.fail_under:
        return 1
    return 0


def _stop(signum, frame):
    raise KeyboardInterrupt


def _run_modules(modules, all_mutants, tree, work, results, args) -> None:
    for mod in modules:
        tests = [t for t in TARGETS[mod] if (tree / t).exists()]
        marked_only = [t for t in MUTANT_TESTS if (tree / t).exists() and t not in tests]
        if not args.no_mutant_tests:
            tests += marked_only
        traced = trace(tree, mod, tests, work, marked_only=marked_only, drop_marked=args.no_mutant_tests)
        ms = all_mutants[mod]
        ms.sort(key=lambda ms_: (ms_[0].line, ms_[0].index, ms_[0].variant))
        print(f"== {mod}: {len(ms)} mutants, {len(traced['tests'])} tests "
              f"(traced run {traced['seconds']:.0f} s)", flush=True)
        for i, (m, src) in enumerate(ms):
            run_mutant(tree, m, src, traced)
            results.append(m)
            mark = {"killed": ".", "timeout": "t", "survived": "S", "uncovered": "U"}[m.status]
            print(mark, end="" if (i + 1) % 80 else "\n", flush=True)
            (work / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
        print(flush=True)


def _score(ms: list[Mutant]) -> tuple[int, int, float]:
    killed = sum(m.status in ("killed", "timeout") for m in ms)
    return killed, len(ms), 100.0 * killed / max(len(ms), 1)


def report(results: list[Mutant]) -> str:
    lines = ["", "module                                   killed/total   score  survived uncovered"]
    by_mod: dict[str, list[Mutant]] = {}
    for m in results:
        by_mod.setdefault(m.module, []).append(m)
    for mod, ms in by_mod.items():
        k, n, s = _score(ms)
        lines.append(f"{mod:40s} {k:5d}/{n:<6d} {s:6.1f}% {sum(m.status == 'survived' for m in ms):8d}"
                     f" {sum(m.status == 'uncovered' for m in ms):9d}")
    k, n, s = _score(results)
    lines.append(f"{'TOTAL':40s} {k:5d}/{n:<6d} {s:6.1f}%")
    surv = [m for m in results if m.status in ("survived", "uncovered")]
    if surv:
        lines += ["", "surviving mutants:"]
        for m in surv:
            lines.append(f"  {m.module}:{m.line} [{m.status}] {m.kind}: {m.before!r} -> {m.after!r}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
