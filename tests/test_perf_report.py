"""perf/report.py: the result JSON perf/run.py writes, rendered into perf/RESULTS.md's
tables (each suite's columns; the machine line; a suite without a renderer says so)."""
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "perf"))
import report  # noqa: E402  (perf/report.py)

MACHINE = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04",
           "versions": {"numba_cuda": "0.30.4", "torch": "2.11.0+cu130"},
           "commit": "abc1234", "when": "2026-12-07 03:00 UTC"}


def _write(tmp_path, name, rows):
    (tmp_path / f"{name}.json").write_text(json.dumps({"machine": MACHINE, "rows": rows}))


def test_each_suite_renders_its_columns(tmp_path):
    _write(tmp_path, "bench", {"meta": {}, "rows": [
        {"op": "softmax", "shape": "8192x4096", "dtype": "float32", "timing": "graph",
         "gbps": 3071.4, "pct_copy": 95.2, "tflops": None, "vs_torch": 1.534}]})
    _write(tmp_path, "gemm", [{"shape": [4096, 4096, 4096], "row": "bf16", "tflops": 701.2,
                               "cublas_tflops": 730.0, "ratio": 0.9605, "rel_err": 2.1e-3}])
    _write(tmp_path, "conv", {"rows": [{"layer": "s2_3x3", "cudnn_tflops": 410.0,
                                        "auto": {"tflops": 350.0, "vs_cudnn": 0.8537},
                                        "bwd": {"cudnn_data_ms": 1.0, "data_ms": 1.25,
                                                "cudnn_filter_ms": 2.0, "filter_ms": 2.5}}],
                              "geomean": {"all": {"auto": 0.81}}})
    _write(tmp_path, "attention", [{"dtype": "bfloat16", "B": 4, "Hq": 16, "Hk": 16,
                                    "Sq": 4096, "Sk": 4096, "D": 128, "causal": True,
                                    "nbdnn_tflops": 512.3, "x_default": 0.83,
                                    "bwd_x_default": "no flash", "rel_err": 3e-3}])
    _write(tmp_path, "torch_models", [{"model": "gpt2", "flops_on_nbdnn": 1.0,
                                       "kernels_compiled": 26, "configs": {"bf16": {
                                           "train": [70.0, 100.0], "infer": [20.0, 16.0],
                                           "train_peak_bytes": [2 * 2**30, 3 * 2**30]}}}])
    _write(tmp_path, "latency", [{"anything": 1}])
    text = "\n".join(report.render(str(tmp_path)))
    assert text.index("### attention") < text.index("### bench") < text.index("### conv")
    assert "NVIDIA H100 80GB HBM3, driver 580.159.04; numba_cuda 0.30.4, torch " \
           "2.11.0+cu130; commit abc1234, 2026-12-07 03:00 UTC" in text
    assert "| softmax | 8192x4096 | float32 | graph | 3071 | 95% | – | 1.53× |" in text
    assert "| 4096 × 4096 × 4096 | bf16 | 701.2 | 730.0 | 0.96× | 2.1e-03 |" in text
    assert "| s2_3x3 | 410.0 | 350.0 | 0.85× | 0.80× | 0.80× |" in text
    assert "| geomean, all | | | auto 0.81× | | |" in text
    assert "| bfloat16 | 4 × 16/16 × 4096 × 4096 × 128 | yes | 512 | 0.83× | – | – | " \
           "3.0e-03 |" in text  # (a peer's error message is no number)
    assert "| gpt2 | bf16 | train | 70.00 | 100.00 | 0.70× |" in text
    assert "| gpt2 | bf16 | infer | 20.00 | 16.00 | 1.25× |" in text
    assert "gpt2 bf16: training step's peak memory 3.00 GiB against native's 2.00 (1.50×)" in text
    assert "gpt2: 100.0% of the forward's FLOPs on nbdnn; 26 kernels" in text
    assert "(no renderer for 'latency' in perf/report.py)" in text


def test_no_results_says_how_to_record_them(tmp_path):
    assert "perf/run.py bench" in report.render(str(tmp_path / "none"))[0]


def test_a_later_run_of_some_rows_renders_as_its_suite(tmp_path):
    """NAME-PART.json (a later run of some of a suite's rows, its own machine line)
    renders with NAME's renderer under its own heading."""
    _write(tmp_path, "torch_models-resnet50", [{"model": "resnet50", "configs": {
        "fp32": {"infer-graphed": [5.6, 8.0]}}}])
    text = "\n".join(report.render(str(tmp_path)))
    assert "### torch_models-resnet50" in text and "commit abc1234" in text
    assert "| resnet50 | fp32 | infer-graphed | 5.60 | 8.00 | 0.70× |" in text
