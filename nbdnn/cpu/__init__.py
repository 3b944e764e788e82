"""The reference backend: vectorised NumPy/SciPy, one module per op family, the same
function names as nbdnn.cuda. The docstrings carry the math; with float64 inputs the
results are the oracle the CUDA kernels are held to."""
