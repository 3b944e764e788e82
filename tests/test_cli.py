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
