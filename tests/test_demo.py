"""``python -m rfgp demo`` runs, writes its plot, and the sketched GP matches the exact one."""

import torch

from rfgp.__main__ import main
from rfgp.demo import demo_data, run_demo


def test_demo_sketched_gp_matches_exact_gp(tmp_path):
    plot = tmp_path / "demo.png"
    exact, sketched = run_demo(num_train=600, num_features=256, num_iterations=15, plot_path=str(plot), progress=False)
    assert plot.stat().st_size > 10_000
    assert sketched.rmse < 1.2 * exact.rmse
    assert abs(sketched.mnll - exact.mnll) < 0.2


def test_demo_command_line(tmp_path, capsys):
    plot = tmp_path / "cli.png"
    main(["demo", "--num-train", "300", "--num-features", "64", "--iterations", "2", "--plot", str(plot)])
    out = capsys.readouterr().out
    assert "test RMSE" in out and "rfgp RFF F=64" in out
    assert plot.exists()


def test_demo_data_has_the_requested_number_of_points_outside_the_gap():
    train_x, train_y, test_x, test_y, _ = demo_data(300, num_test=500)
    assert train_x.shape == (300, 1) and train_y.shape == (300,)
    assert test_x.shape == (500, 1) and test_y.shape == (500,)
    x = torch.cat([train_x, test_x]).squeeze(-1)
    assert not ((x >= 0.5) & (x <= 1.5)).any()
