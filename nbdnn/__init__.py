"""nbdnn: cuDNN's primitives as numba.cuda kernels, each with a NumPy/SciPy reference.

NumPy arrays run on the CPU reference, CUDA arrays (numba, CuPy, PyTorch) on the GPU;
`backend="cuda"` moves NumPy inputs to the GPU and the results back."""
from .errors import (BadParamError, DeviceError, DtypeError, NbdnnError,
                     NotSupportedError, ShapeError)
from .ops.activation import activation, activation_backward
from .ops.tensor import (add_tensor, op_tensor, reduce_tensor, scale_tensor, set_tensor,
                         transform_tensor)
from .ops.softmax import softmax, softmax_backward
from .ops.matmul import matmul, matmul_backward
from .ops.dropout import dropout, dropout_backward
from .ops.norm import (group_norm, group_norm_backward, instance_norm, instance_norm_backward,
                       layer_norm, layer_norm_backward, rms_norm, rms_norm_backward)
from .ops.conv import (conv1d, conv2d, conv3d, conv_backward_bias, conv_backward_data,
                       conv_backward_filter, find_conv_algorithm)
from .ops.pool import pool1d, pool2d, pool3d, pool_backward
from .ops.batch_norm import batch_norm_backward, batch_norm_infer, batch_norm_train
from .ops.lrn import lrn, lrn_backward

from .ops._plan import planned as _planned

# Eager CUDA calls replay per-signature plans (nbdnn/ops/_plan.py; NBDNN_PLANS=0 turns
# them off; `op.unplanned` is the bare op), but for find_conv_algorithm.
_PLANNED = ("activation", "softmax", "activation_backward", "add_tensor", "op_tensor", "reduce_tensor",
            "scale_tensor", "set_tensor", "transform_tensor", "softmax_backward",
            "matmul", "matmul_backward", "dropout", "dropout_backward", "group_norm",
            "group_norm_backward", "instance_norm", "instance_norm_backward", "layer_norm",
            "layer_norm_backward", "rms_norm", "rms_norm_backward", "conv1d", "conv2d",
            "conv3d", "conv_backward_bias", "conv_backward_data", "conv_backward_filter",
            "pool1d", "pool2d", "pool3d", "pool_backward", "batch_norm_backward",
            "batch_norm_infer", "batch_norm_train", "lrn", "lrn_backward")
for _name in _PLANNED:
    globals()[_name] = _planned(globals()[_name])
del _name

__version__ = "0.1.0"
