"""`tgsim compare bits` on the torch models (problems "resnet" and "transformer", worker counts, the
transformer's own Adam grid, the unstratified validation split) and `tgsim compare time` on a net
described by a JSON file (its real layer shapes and measured seconds, hardware row "host-cpu").
Deterministic checks; the few training steps run at seed 0. Skipped where torch is not installed."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from tgsim.analysis import compare_bits as cb
from tgsim.analysis import compare_time as ct
from tgsim.analysis.perfmodel_nets import net_from_file
from tgsim.cli import main


def test_real_problems_are_reachable_but_not_in_the_default_list():
    from tgsim.analysis.compare_cli import BITS

    assert set(cb.REAL_PROBLEMS) == {"resnet", "transformer"}
    assert not set(cb.REAL_PROBLEMS) & set(cb.PROBLEMS)
    assert set(BITS["problems"][0].split(",")) == set(cb.PROBLEMS)
    assert {**cb.PROBLEMS, **cb.REAL_PROBLEMS} == cb.ALL_PROBLEMS


def test_real_problem_configs_name_the_torch_model_and_its_optimizer():
    t = cb.config(cb.REAL_PROBLEMS["transformer"], "fp32", 0, 5, 0.003)
    assert t.model.name == "torch" and t.model.options["factory"] == "tgsim.torch.examples:char_transformer"
    assert t.model.options["kwargs"] == {"d_model": 64, "heads": 4, "layers": 2}
    assert t.optimizer.name == "adam" and t.data.name == "pychars"
    assert t.data.options == {"num_samples": 20000, "context": 32}     # no stratified validation option
    r = cb.config(cb.REAL_PROBLEMS["resnet"], "fp32", 0, 5, 0.05, cb.VALIDATION)
    assert r.model.options == {"factory": "tgsim.torch.examples:resnet", "kwargs": {"blocks": 1, "width": 8}}
    assert r.optimizer.name == "momentum" and r.optimizer.momentum == 0.9
    assert r.data.options == {"validation": cb.VALIDATION}


def test_grid_and_worker_counts_per_problem():
    t, r = cb.REAL_PROBLEMS["transformer"], cb.REAL_PROBLEMS["resnet"]
    assert cb.grid_of(t, cb.LR_GRID) == cb.ADAM_GRID and cb.grid_of(r, cb.LR_GRID) == cb.SGD_REAL_GRID
    assert cb.grid_of(cb.PROBLEMS["convnet"], cb.LR_GRID) == cb.LR_GRID      # make figures' problems unchanged
    assert cb.grid_of(t, ()) == ()                      # no tuning at all: every method at Problem.lr
    p = cb.at_workers(r, 8)
    assert (p.name, p.workers, p.batch) == ("resnet-n8", 8, r.batch)
    with pytest.raises(ValueError, match="divide the total batch"):
        cb.at_workers(r, 3)


def test_an_unstratified_problem_asks_the_data_layer_for_a_plain_validation_draw():
    """The transformer's validation rows: `data.options.validation_stratify = false` (pychars has
    next-byte classes seen once, which a stratified split refuses); the ResNet's stay stratified; no
    option without a validation split."""
    t = cb.config(cb.REAL_PROBLEMS["transformer"], "fp32", 0, 5, 0.003, cb.VALIDATION)
    assert t.data.options["validation"] == cb.VALIDATION and t.data.options["validation_stratify"] is False
    r = cb.config(cb.REAL_PROBLEMS["resnet"], "fp32", 0, 5, 0.05, cb.VALIDATION)
    assert "validation_stratify" not in r.data.options
    assert "validation_stratify" not in cb.config(cb.REAL_PROBLEMS["transformer"], "fp32", 0, 5, 0.003).data.options


def test_cli_rejects_worker_counts_that_do_not_divide_the_batch(capsys):
    with pytest.raises(SystemExit, match="divide the total batch"):
        main(["compare", "bits", "--problems", "resnet", "--workers", "3", "--out", "unused"])
    with pytest.raises(SystemExit, match="comma-separated integers"):
        main(["compare", "bits", "--problems", "resnet", "--workers", "four", "--out", "unused"])


def test_resnet_trains_a_few_steps_through_compare_bits():
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install tgsim[torch])")
    p = cb.at_workers(cb.REAL_PROBLEMS["resnet"], 4)
    r = cb._job((p, "fp32", 0, 2, None, 4, 0.05, 0.0, 4))
    assert r["status"] == "not reached in 4" and r["steps"] == 4 and r["common_status"] == "ok"
    n = sum(math.prod(s) for s in _shapes(p).values())
    assert r["bits_up_per_element"] == pytest.approx(2 * 3 / 4 * 32)   # the fp32 ring at N = 4
    assert r["bits_up"] == pytest.approx(4 * n * 2 * 3 / 4 * 32)
    assert 0.0 <= r["accuracy_common"] <= 1.0 and math.isfinite(r["test_loss_common"])


def _shapes(problem) -> dict:
    from tgsim.train.loop import build

    return build(cb.config(problem, "fp32", 0, 1)).model.layer_shapes()


def _net_file(tmp_path, **over):
    d = {"name": "toy", "batch": 8, "seconds": 0.004, "source": "test",
         "layers": [{"name": "conv", "shapes": [[4, 1, 3, 3], [4]]}, {"name": "fc", "shapes": [[10, 4], [10]]}]}
    d.update(over)
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(d))
    return path


def test_net_file_gives_real_shapes_and_the_measured_seconds(tmp_path):
    net = net_from_file(_net_file(tmp_path))
    assert net.name == "toy" and net.params == 4 * 9 + 4 + 40 + 10
    assert [l.kind for l in net.layers] == ["conv", "fc"] and [l.macs for l in net.layers] == [40, 50]
    assert net.layers[0].shapes == ((4, 1, 3, 3), (4,))
    assert net.compute_seconds("p100") == pytest.approx(0.004)
    assert net.compute_seconds("p100", 16) == pytest.approx(0.008)       # linear in the batch


@pytest.mark.parametrize("over, field", [({"seconds": 0}, "seconds"), ({"batch": 0}, "batch"),
                                         ({"layers": [{"shapes": [[0, 3]]}]}, "shapes"),
                                         ({"layers": []}, "layers"), ({"fwd_frac": 1.0}, "fwd_frac"),
                                         ({"layers": [{"shapes": [[3]], "kind": "rnn"}]}, "kind")])
def test_net_file_refuses_bad_fields(tmp_path, over, field):
    with pytest.raises(ValueError, match=field):
        net_from_file(_net_file(tmp_path, **over))
    bad = tmp_path / "missing.json"
    bad.write_text(json.dumps({"name": "x", "batch": 1, "seconds": 1.0}))
    with pytest.raises(ValueError, match="missing field 'layers'"):
        net_from_file(bad)


def test_model_times_on_a_net_file_use_the_measured_compute_on_the_host_row(tmp_path):
    net = net_from_file(_net_file(tmp_path))
    floats = list(ct.floats())
    steps = pd.DataFrame([dict(rule="own-lr", problem="toy", method=m, lr=0.1, K=10.0, K_seed={0: 10.0, 1: 10.0})
                          for m in floats])
    wire = ct.measure_wire(floats, workers=(8, 64), n=1 << 10)
    cost = ct.measure_codec_cost(floats, n=1 << 10, workers=2, repeats=1)
    df = ct.model_times(steps, wire, cost, nets=[net], workers=(8, 64), hardware=(ct.HOST,), codec_cost="host")
    assert set(df.net) == {"toy"} and set(df.hardware) == {ct.HOST}
    np.testing.assert_allclose(df.compute, 0.004)             # speed 1: the measured seconds unchanged
    assert (df.t_step > df.compute).all()                     # every message crosses the network
    with pytest.raises(ValueError, match="unknown hardware row"):
        ct.hardware_row("tpu")


def test_compare_time_cli_refuses_a_bad_net_file_before_running(tmp_path, capsys):
    bad = _net_file(tmp_path, seconds=-1)
    assert main(["compare", "time", "--bits", str(tmp_path / "none"), "--net-file", str(bad),
                 "--out", str(tmp_path / "out")]) == 2
    assert "seconds must be" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_a_rate_chosen_at_the_edge_of_its_grid_is_named():
    """at_grid_edge: a method whose own chosen rate is its grid's smallest or largest is listed with
    which edge; one chosen inside the grid, or a one-rate grid, is not."""
    import pandas as pd

    rows = []
    for method, chosen in (("fp32", 0.2), ("qsgd", 0.05), ("sign", 0.025)):
        rows += [dict(problem="resnet", method=method, lr=lr, chosen_own_lr=lr == chosen) for lr in (0.025, 0.05, 0.2)]
    rows.append(dict(problem="resnet", method="one", lr=0.1, chosen_own_lr=True))
    edge = cb.at_grid_edge(pd.DataFrame(rows))
    assert edge.to_dict("records") == [{"problem": "resnet", "method": "fp32", "lr": 0.2, "edge": "highest"},
                                       {"problem": "resnet", "method": "sign", "lr": 0.025, "edge": "lowest"}]
