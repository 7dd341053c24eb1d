"""Layers import downward only, and the errors every layer raises come from one module.

The layers, bottom to top: errors, backend, rng, blas -> codecs -> models, data -> exchange ->
train -> analysis, bench, cli. A module may import from its own layer or below, never above
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
         "tgsim.codecs": 1, "tgsim.models": 2, "tgsim.data": 2, "tgsim.exchange": 3, "tgsim.train": 4,
         "tgsim.bench": 5}


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
