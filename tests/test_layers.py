"""Layers import downward only, and the errors every layer raises come from one module.

The layers, bottom to top: errors, backend, rng, blas -> codecs -> models, data -> exchange ->
train -> analysis, bench, runs, plotting, cli. A module may import from its own layer or below, never above
(checked on the source: `import` and `from ... import` statements, at module level or inside
functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
LAYER = {"tgsim.errors": 0, "tgsim.backend": 0, "tgsim.rng": 0, "tgsim.blas": 0,
         "tgsim.codecs": 1, "tgsim.models": 2, "tgsim.data": 2, "tgsim.torch": 2, "tgsim.exchange": 3,
         "tgsim.train": 4, "tgsim.torch.ddp": 4, "tgsim.torch.ddp_bucket": 4,
         "tgsim.bench": 5, "tgsim.runs": 5, "tgsim.plotting": 5}


def _layer(module: str) -> int | None:
    for prefix, level in sorted(LAYER.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            return level
    return None


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def _modules():
    for path in sorted((REPO / "tgsim").rglob("*.py")):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if _layer(name) is not None:
            yield name, path


@pytest.mark.parametrize("name,path", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_imports_point_downward(name, path):
    own = _layer(name)
    upward = [m for m in _imports(path) if (_layer(m) or -1) > own]
    assert not upward, f"{name} (layer {own}) imports from a higher layer: {upward}"


def test_an_upward_import_is_caught(tmp_path):
    """Positive control: the check sees an exchange module importing the trainer's ConfigError."""
    bad = tmp_path / "mpi.py"
    bad.write_text("def f():\n    from tgsim.train.config import ConfigError\n")
    assert [m for m in _imports(bad) if _layer(m) > _layer("tgsim.exchange.mpi")]


def test_errors_are_one_family_and_keep_their_old_bases():
    from tgsim import errors
    from tgsim.codecs import NonFiniteGradientError
    from tgsim.codecs.message import parse_header
    from tgsim.exchange import mpi
    from tgsim.train.config import ConfigError

    assert ConfigError is errors.ConfigError and NonFiniteGradientError is errors.NonFiniteGradientError
    assert mpi.PeerPayloadError is errors.PeerPayloadError and issubclass(errors.PeerPayloadError, ValueError)
    assert issubclass(errors.RankConfigMismatchError, (errors.ConfigError, errors.CollectiveError))
    with pytest.raises(errors.PayloadError, match="not a tgsim message"):
        parse_header(b"XXXX" + bytes(64))
    from tgsim.codecs import packing

    with pytest.raises(errors.PayloadError, match="invalid code 0b11"):
        packing.unpack(np.array([0xFF], np.uint8), 4, "2bit")


# The exchange and the trainer see codecs only through the protocol and the public wire modules.
PUBLIC_CODEC_MODULES = {"tgsim.codecs", "tgsim.codecs.base", "tgsim.codecs.registry", "tgsim.codecs.message",
                        "tgsim.codecs.packing", "tgsim.codecs.ordered_mean",
                        "tgsim.codecs.error_feedback",   # the wrapper of any codec (names none)
                        "tgsim.codecs.options"}          # how every codec declares and checks its Options


def _codec_leaks(path: Path) -> list[str]:
    """Imports of a codec's own modules, and the word TernGrad, in one source file."""
    leaks = []
    for m in _imports(path):
        if m.startswith("tgsim.codecs") and m not in PUBLIC_CODEC_MODULES \
                and m.rsplit(".", 1)[0] not in PUBLIC_CODEC_MODULES - {"tgsim.codecs"}:
            leaks.append(f"imports {m}")
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if "terngrad" in line.lower():
            leaks.append(f"line {i} names TernGrad: {line.strip()}")
    return leaks


@pytest.mark.parametrize("path", sorted(p for d in ("exchange", "train") for p in (REPO / "tgsim" / d).rglob("*.py")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_exchange_and_trainer_name_no_codec(path):
    assert not _codec_leaks(path)


def test_a_codec_leak_is_caught(tmp_path):
    """Positive control: an exchange module that imports TernGrad's kernels is caught twice."""
    bad = tmp_path / "x.py"
    bad.write_text("from tgsim.codecs.terngrad import numba_kernels\nfrom tgsim.codecs.message import Layout\n")
    assert _codec_leaks(bad) == ["imports tgsim.codecs.terngrad", "imports tgsim.codecs.terngrad.numba_kernels",
                                 "line 1 names TernGrad: from tgsim.codecs.terngrad import numba_kernels"]
