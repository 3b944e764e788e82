"""The command line: info reports the mode, check cross-checks and exits 0 on success."""
from nbdnn.cli import main


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "numba-cuda" in out and ("SIMULATOR" in out or "hardware" in out)


def test_check_one_op(capsys):
    assert main(["check", "--ops", "activation/relu", "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "activation/relu" in out and "0 failed" in out


def test_help_prints():
    import pytest
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0


def test_names_that_pick_nothing_are_errors(capsys):
    import pytest
    for argv in (["check", "--ops", "nosuchop"], ["check", "--examples", "0"],
                 ["check", "--ops", "softmax", "--dtype", "float16", "--ops", "x"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code not in (0, None), argv


def test_a_mode_name_picks_its_rows(capsys):
    assert main(["check", "--ops", "relu", "--examples", "1", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "activation/relu" in out and "activation_backward/relu" in out
    assert "2 op/dtype pairs, 0 failed" in out


def test_bench_without_a_gpu_says_so():
    import pytest
    from nbdnn.cuda import SIMULATOR
    if not SIMULATOR:
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit) as e:
        main(["bench", "--ops", "activation/relu"])
    assert "GPU" in str(e.value.code)
