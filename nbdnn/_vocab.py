"""The words of the API, defined once: dtypes, layouts, modes and algorithm names. The
front end (ops/) validates against them, the backends (cpu/, cuda/) index kernels by
them (an activation's position in ACTIVATION_MODES is the fused-epilogue code every
CUDA kernel shares), and testing/ draws from them."""

# storage dtypes every op takes; float16 computes in float32, float64 in float64
FLOAT_DTYPES = ("float16", "float32", "float64")
# bfloat16: ml_dtypes.bfloat16 on the CPU, its bits on the GPU, float32 compute
BF16_DTYPES = FLOAT_DTYPES + ("bfloat16",)

ACTIVATION_MODES = ("relu", "leaky_relu", "clipped_relu", "elu", "sigmoid", "tanh", "swish",
                    "gelu", "gelu_tanh", "softplus", "identity", "clamp", "hardswish",
                    "hardsigmoid")
# the coefficient each mode that takes one defaults to (cuDNN's coef / PyTorch's)
ACTIVATION_DEFAULT_COEF = {"leaky_relu": 0.01, "clipped_relu": 6.0, "elu": 1.0, "swish": 1.0,
                           "softplus": 1.0, "clamp": 1.0}

SOFTMAX_ALGOS = ("fast", "accurate", "log")
POOL_MODES = ("max", "avg", "avg_exclude_pad")
CONV_MODES = ("cross_correlation", "convolution")
CONV_ALGOS = ("auto", "direct", "implicit_gemm", "gemm", "winograd", "winograd4", "depthwise")
BATCH_NORM_MODES = ("spatial", "per_activation")

# layout -> (channels last?, rank or None). "NCHW" / "NHWC" name channels first / last
# for any rank (cuDNN's use); the others fix the rank they spell.
LAYOUTS = {"NCHW": (False, None), "NHWC": (True, None), "NC": (False, 2),
           "NCW": (False, 3), "NWC": (True, 3), "NCDHW": (False, 5), "NDHWC": (True, 5)}
# the same rank with the channels moved to the other end (transform_tensor)
LAYOUT_COUNTERPART = {"NCHW": "NHWC", "NHWC": "NCHW", "NCDHW": "NDHWC", "NDHWC": "NCDHW",
                      "NCW": "NWC", "NWC": "NCW"}
SPATIAL_LAYOUTS = tuple(n for n in LAYOUTS if n != "NC")  # conv, pool, lrn: rank >= 3

# the float32 math modes of the matrix products (cuDNN's mathType, PyTorch's
# allow_tf32): IEEE FMA; operands rounded to TF32; each operand split into two TF32
# parts and three products summed (float32 accuracy from TF32 tensor cores)
MATH_MODES = ("ieee", "tf32", "3xtf32")

# where attention's causal diagonal sits when Sq != Sk: top-left (PyTorch's is_causal:
# key j <= query i) or bottom-right (the rows are the sequence's last: j <= i + Sk - Sq,
# decoding after a prefix); a causal call's code in the kernels is its position + 1
# (0: not causal)
ATTENTION_ALIGNMENTS = ("top_left", "bottom_right")
