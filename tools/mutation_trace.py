"""pytest plugin for tools/mutation.py: which test runs which line of one source file.

Loaded as `-p mutation_trace` with tools/ on PYTHONPATH. MUTATION_TRACE_FILE names the file to
watch (an absolute path); MUTATION_TRACE_OUT gets a JSON object {"import": [lines run before the
first test], "tests": {nodeid: {"lines": [...], "duration": seconds, "mutation": marked}}}, marked
being whether the test carries the marker `mutation`. The global trace function declines every
frame of other files, so the suite runs at nearly full speed.

MUTATION_MARKED_ONLY (paths joined by os.pathsep): files of which only the `mutation` tests are
kept; MUTATION_DROP_MARKED=1 deselects every `mutation` test.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

_TARGET = os.path.realpath(os.environ.get("MUTATION_TRACE_FILE", ""))
_current = "import"
_lines: dict[str, set[int]] = {"import": set()}
_durations: dict[str, float] = {}
_marked: dict[str, bool] = {}


def _local(frame, event, arg):
    if event == "line":
        _lines[_current].add(frame.f_lineno)
    return _local


_is_target: dict[str, bool] = {}


def _global(frame, event, arg):
    name = frame.f_code.co_filename
    hit = _is_target.get(name)
    if hit is None:
        hit = _is_target[name] = os.path.realpath(name) == _TARGET
    if hit:
        _lines[_current].add(frame.f_lineno)
        return _local
    return None


def pytest_configure(config):
    sys.settrace(_global)
    threading.settrace(_global)


def pytest_collection_modifyitems(config, items):
    only = {p for p in os.environ.get("MUTATION_MARKED_ONLY", "").split(os.pathsep) if p}
    drop = bool(os.environ.get("MUTATION_DROP_MARKED"))
    keep, gone = [], []
    for item in items:
        marked = item.get_closest_marker("mutation") is not None
        _marked[item.nodeid] = marked
        path = item.nodeid.split("::", 1)[0]
        (gone if (drop and marked) or (path in only and not marked) else keep).append(item)
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current
    _current = item.nodeid
    _lines.setdefault(_current, set())
    t0 = time.perf_counter()
    yield
    _durations[item.nodeid] = time.perf_counter() - t0
    _current = "import"


def pytest_unconfigure(config):
    sys.settrace(None)
    threading.settrace(None)
    out = os.environ.get("MUTATION_TRACE_OUT")
    if not out:
        return
    data = {"import": sorted(_lines.pop("import")),
            "tests": {k: {"lines": sorted(v), "duration": _durations.get(k, 0.0), "mutation": _marked.get(k, False)}
                      for k, v in _lines.items()}}
    with open(out, "w") as f:
        json.dump(data, f)
