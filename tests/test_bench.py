"""`nbdnn bench`'s suite end to end on tiny sizes (the simulator's timings mean
nothing; this checks that every case runs and reports)."""
import json

import pytest

from nbdnn import bench


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_suite_runs_and_reports(tmp_path):
    rows = bench.run_suite(["activation/relu", "reduce_tensor/add/all", "matmul/skinny"],
                           cpu=True, size_mb=0.004)
    names = [r.op for r in rows]
    assert names == ["activation/relu", "reduce_tensor/add/all", "matmul/skinny"]
    mm = rows[-1]
    assert mm.flops > 0 and mm.tflops > 0
    table = bench.format_table(rows)
    assert "TFLOP/s" in table and len(table.splitlines()) == len(rows) + 2
    path = tmp_path / "bench.json"
    bench.save_json(rows, str(path), {"note": "test"})
    assert len(json.loads(path.read_text())["rows"]) == len(rows)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_suite_times_graph_replays():
    """graph=True times each nbdnn call from a captured graph (replayed eagerly under
    the simulator) and says so per row; the default stays eager."""
    ops = ["activation/relu", "matmul/skinny"]
    rows = bench.run_suite(ops, cpu=False, size_mb=0.004, graph=True)
    assert len(rows) == 2 and all(r.timing == "graph" and r.gpu_s > 0 for r in rows)
    assert all(r.timing == "eager" for r in bench.run_suite(ops[:1], cpu=False,
                                                             size_mb=0.004))


def test_json_has_no_nan(tmp_path):
    """An unmeasured figure (the copy bandwidth under the simulator) is null: valid JSON."""
    row = bench.Row("x", "1", "float32", 4, 1e-3, float("nan"))
    path = tmp_path / "b.json"
    bench.save_json([row], str(path), {"copy": float("inf")})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["rows"][0]["pct_copy"] is None


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_suite_runs_in_a_16_bit_dtype(monkeypatch):
    """dtype= runs the same cases on 16-bit buffers (half the bytes of float32's) and
    leaves out a case whose op does not take the dtype, saying so."""
    from nbdnn.bench import cases_compute
    from nbdnn.bench.case import BenchCase
    from nbdnn.errors import DtypeError

    def refuses(d, h):
        raise DtypeError("an op that takes float32 only")
    real = cases_compute.matmul_cases
    monkeypatch.setattr(cases_compute, "matmul_cases", lambda n: real(n) + [
        BenchCase("refuses/16-bit", "matmul", (1,), 4, refuses)])
    said = []
    ops = ["activation/relu", "reduce_tensor/add/all", "refuses/16-bit"]
    rows = bench.run_suite(ops, cpu=True, size_mb=0.004, dtype="bfloat16",
                           progress=lambda i, n, label: said.append(label))
    assert [r.op for r in rows] == ops[:2] and all(r.dtype == "bfloat16" for r in rows)
    assert any(s.startswith("refuses/16-bit: left out (DtypeError") for s in said), said
    f32 = bench.run_suite(ops[:1], cpu=False, size_mb=0.004)
    assert rows[0].bytes * 2 == f32[0].bytes


def test_host_costs_times_each_function_and_its_excess_in_turn():
    """host_costs: a median per function and, per function after the first, its excess
    over the first within each round (here a call that does ~20 us more work)."""
    order = []

    def cheap():
        order.append("a")

    def dear():
        order.append("b")
        sum(range(2000))

    (a, b), (excess,) = bench.host_costs([cheap, dear], rounds=4, calls=5, warmup=1,
                                         sync=lambda: None)
    assert 0 < a < b and 0 < excess <= b
    assert "".join(order[2:]) == "aaaaabbbbb" * 4  # (after the warm-ups: in turn)
