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


def _usage_error(argv, capsys):
    """argv is refused by argparse up front: exit 2, a usage line, no traceback."""
    import pytest
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage:" in err and "Traceback" not in err, (argv, err)
    return err


def test_bad_numbers_are_usage_errors_up_front(capsys):
    assert "--seed" in _usage_error(["check", "--seed", "-1"], capsys)
    assert "--examples" in _usage_error(["check", "--examples", "0"], capsys)
    assert "--size-mb" in _usage_error(["bench", "--size-mb", "-1"], capsys)
    assert "--size-mb" in _usage_error(["bench", "--size-mb", "nan"], capsys)


def test_no_arguments_print_the_help_and_version_prints(capsys):
    import pytest

    import nbdnn
    assert main([]) == 0
    assert "usage: nbdnn" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and nbdnn.__version__ in capsys.readouterr().out


def test_plot_without_matplotlib_is_refused_before_any_work(capsys, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_matplotlib(name, *args, **kw):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("no matplotlib here")
        return real(name, *args, **kw)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    from nbdnn import demo
    monkeypatch.setattr(demo, "train", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("trained before refusing")))
    assert "matplotlib" in _usage_error(["demo", "--plot", "x.png"], capsys)
    assert "matplotlib" in _usage_error(["bench", "--plot", "x.png"], capsys)


def test_progress_bars_only_on_a_terminal(capsys):
    from nbdnn.cli import _progress
    _progress(1, 4, "activation/relu")  # (capsys's stderr is no terminal)
    assert capsys.readouterr().err == ""


def test_a_closed_pipe_ends_quietly():
    """`nbdnn info | head -1`: the reader is gone before nbdnn writes; no BrokenPipeError
    traceback, exit status 1."""
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "nbdnn", "info"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # (before the child's first write: it starts for ~1 s)
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_cache_info_and_clear(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", str(tmp_path / "kc"))
    assert main(["cache", "info"]) == 0
    assert "empty" in capsys.readouterr().out
    os_ = __import__("os")
    os_.makedirs(tmp_path / "kc", mode=0o700)
    (tmp_path / "kc" / "k-0123.nbk").write_bytes(b"x" * 2000)
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "kc") in out and "1, 0.0 MB" in out and "state    on\n" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out and not os_.listdir(tmp_path / "kc")
    monkeypatch.setenv("NBDNN_KERNEL_CACHE", "0")
    assert main(["cache", "info"]) == 0
    assert "off" in capsys.readouterr().out


def test_cache_warm_counts_every_registered_signature(capsys):
    """`nbdnn cache warm` sums up what it compiled ahead (under the simulator nothing:
    every registered signature is left to its first launch)."""
    from nbdnn.cuda import SIMULATOR
    from nbdnn.cuda.runtime.launch.kernel import REGISTRY
    assert main(["cache", "warm", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    n = sum(len(k.sigs) for k in REGISTRY)
    assert out.startswith(f"nbdnn precompile: {n} kernel signatures")
    if SIMULATOR:
        assert f"{n} left to compile on first launch" in out


def test_check_prints_a_failing_case_so_it_can_be_run_again(capsys, monkeypatch):
    """A failure's lines name the row, dtype, example, the call's shapes and parameters,
    and a command that draws the same case again (the case's seed depends on --seed,
    the row, the dtype and the example only)."""
    from nbdnn import testing
    seen = []
    real = testing.crosscheck

    def failing(spec, case, dtype, **kw):
        seen.append([getattr(a, "shape", a) for a in case.args])
        r = real(spec, case, dtype, **kw)
        r.update(ok=False, msg="planted failure")
        return r
    monkeypatch.setattr(testing, "crosscheck", failing)
    assert main(["check", "--ops", "pool", "--dtype", "float32", "--seed", "5",
                 "--examples", "2"]) == 1
    out = capsys.readouterr().out
    assert "FAILED pool float32, example 1: planted failure" in out
    assert "call: pool(array(" in out and "stride=" in out
    assert "again: nbdnn check --ops pool --dtype float32 --seed 5 --examples 1" in out
    first = seen[0]
    seen.clear()
    main(["check", "--ops", "softmax", "pool", "--dtype", "float32", "--seed", "5",
          "--examples", "1"])  # (another selection: the pool case is the same)
    assert first in seen


def test_check_reports_the_share_of_tolerance_used(capsys):
    assert main(["check", "--ops", "activation/relu", "--examples", "1", "--dtype",
                 "float32"]) == 0
    out = capsys.readouterr().out
    assert "err/tol" in out and "max rel" not in out
