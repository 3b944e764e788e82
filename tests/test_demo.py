"""The digits demo on the CPU backend: 8 epochs (~3 s here) reach the issue's 97% test
accuracy, in float32 and in 16-bit mixed precision, the transformer 95% in 10, and
`nbdnn demo` prints its table."""
import pytest

pytest.importorskip("sklearn")

from nbdnn import cli, demo  # noqa: E402


def test_digits_cnn_reaches_97_percent_on_cpu():
    r = demo.train("cpu", epochs=8, quiet=True)
    assert r["accuracy"] >= 0.97, r["accuracy"]
    n = r["steps_per_epoch"]
    first, last = sum(r["losses"][:n]) / n, sum(r["losses"][-n:]) / n
    assert last < first / 5, (first, last)


def test_digits_cnn_reaches_97_percent_in_16_bits():
    """Mixed precision: float16 layers with float32 master weights and dynamic loss
    scaling reach the same 97% on the CPU backend (99.2% here, as float32; bfloat16
    too, 99.2%: the GPU suite runs both, CI this one for time)."""
    r = demo.train("cpu", epochs=8, quiet=True, precision="fp16")
    assert r["accuracy"] >= 0.97, r["accuracy"]
    assert r["precision"] == "fp16"


def test_digits_transformer_reaches_95_percent_on_cpu():
    """Issue 25's example: the digits as sequences of 8 pixel rows through one
    TransformerBlock (96.4% after 10 epochs here, ~3 s)."""
    r = demo.train("cpu", epochs=10, quiet=True, model="transformer")
    assert r["accuracy"] >= 0.95, r["accuracy"]
    n = r["steps_per_epoch"]
    assert sum(r["losses"][-n:]) < sum(r["losses"][:n]) / 5


def test_demo_command_prints_the_table(capsys):
    assert cli.main(["demo", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "backend" in out and "cpu" in out and "test acc" in out
    assert cli.main(["demo", "--epochs", "1", "--model", "transformer"]) == 0


def test_demo_refuses_bad_numbers():
    for bad in (["--batch", "0"], ["--lr", "nan"], ["--epochs", "0"], ["--batch", "5000"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["demo"] + bad)
        assert e.value.code == 2, bad


def test_demo_without_a_gpu_trains_on_the_cpu(capsys):
    from nbdnn.cuda import SIMULATOR
    if not SIMULATOR:
        pytest.skip("a GPU is here")
    assert cli.main(["demo", "--epochs", "1", "--backend", "both", "--mode", "both"]) == 0
    captured = capsys.readouterr()
    assert "no GPU" in captured.err and "cpu" in captured.out
