"""nbdnn.nn's layers (re-exported there): each holds its parameters in `params` and,
after `backward`, their gradients in `grads`; `forward(x, train)` keeps what
`backward(dy)` needs. Built only from nbdnn ops, so the same code runs on both backends.
`move`, `copy_into`, `device_of`: arrays between the backends."""
import numpy as np

import nbdnn


def move(a, device):
    """a on "cpu" (a NumPy array), "cuda" (a device array: where it already is, else on
    the current device) or "cuda:N" (on device N; from another device through the host);
    arrays already there stay."""
    from ..cuda.runtime.memory.arrays import to_device, to_host
    if device == "cpu":
        return a if isinstance(a, np.ndarray) else to_host(a)
    ordinal = cuda_ordinal(device)
    if not isinstance(a, np.ndarray):
        if ordinal is None or _device().of(a) == ordinal:
            return a
        a = to_host(a)
    with _device().on(ordinal):
        return to_device(a)


def copy_into(dst, a):
    """dst[...] = a in place, for dst and a on either device (shapes must match)."""
    if isinstance(dst, np.ndarray):
        dst[...] = move(a, "cpu")
    elif isinstance(a, np.ndarray) and hasattr(dst, "copy_to_device"):
        dst.copy_to_device(np.ascontiguousarray(a, dst.dtype))
    else:  # (a torch tensor: CUDA bfloat16; a converted on the way, a batch to 16 bits)
        nbdnn.cast_tensor(move(a, device_of(dst)), str(dst.dtype).rpartition(".")[2],
                          out=dst)


def device_of(a):
    """"cpu" for a NumPy array; for a device array "cuda", or "cuda:N" where several
    devices are visible."""
    if isinstance(a, np.ndarray):
        return "cpu"
    dev = _device()
    return "cuda" if dev.count() == 1 else f"cuda:{dev.of(a)}"


def cuda_ordinal(device):
    """None for "cuda" (the current device), N for "cuda:N" (a DeviceError when N is not
    a visible device); a BadParamError for anything else but "cpu"."""
    if device == "cuda":
        return None
    head, _, tail = str(device).partition(":")
    if head != "cuda" or not tail.isdigit():
        raise nbdnn.BadParamError(f"to: device must be 'cpu', 'cuda' or 'cuda:N', got "
                                  f"{device!r}")
    n = _device().count()
    if int(tail) >= n:
        raise nbdnn.DeviceError(f"to: {device} is not a visible device ({n} visible)")
    return int(tail)


def _device():
    from ..cuda.runtime import device
    return device


class Layer:
    """A layer without parameters; subclasses override forward and backward."""

    def __init__(self):
        self.params, self.grads, self.buffers = {}, {}, {}

    def forward(self, x, train=False):
        raise NotImplementedError

    def backward(self, dy, need_dx=True):
        raise NotImplementedError

    def layers(self):
        """This layer and the layers inside it, in order."""
        return [self]

    def to(self, device):
        """Move parameters and buffers to "cpu" (NumPy), "cuda" (device arrays on the
        current device) or "cuda:N" (on device N: its calls then run there)."""
        if device != "cpu":
            cuda_ordinal(device)  # (checked before anything moves)
        for layer in self.layers():
            for d in (layer.params, layer.buffers):
                for k in d:
                    d[k] = move(d[k], device)
            layer.grads = {}
        return self


def _he(rng, shape, fan_in, dtype):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)


class Conv2d(Layer):
    """y = conv2d(x, w) + b; x (N, C, H, W), w (K, C/groups, R, R) He-initialised; with
    layout "NHWC" x (N, H, W, C) and w (K, R, R, C/groups), the same weights transposed
    (16-bit channels-last convolutions run on sm_90's tensor cores)."""

    def __init__(self, C, K, R, *, stride=1, padding=0, groups=1, bias=True, seed=0,
                 dtype=np.float32, layout="NCHW"):
        super().__init__()
        rng = np.random.default_rng(seed)
        w = _he(rng, (K, C // groups, R, R), C // groups * R * R, dtype)
        self.params["w"] = np.ascontiguousarray(w.transpose(0, 2, 3, 1)) \
            if layout == "NHWC" else w
        if bias:
            self.params["b"] = np.zeros(K, dtype)
        self.kw = dict(stride=stride, padding=padding, groups=groups, layout=layout)

    def forward(self, x, train=False):
        self.x = x
        return nbdnn.conv2d(x, self.params["w"], self.params.get("b"), **self.kw)

    def backward(self, dy, need_dx=True):
        w = self.params["w"]
        self.grads["w"] = nbdnn.conv_backward_filter(dy, self.x, tuple(w.shape), **self.kw)
        if "b" in self.params:
            self.grads["b"] = nbdnn.conv_backward_bias(dy, layout=self.kw["layout"])
        return nbdnn.conv_backward_data(dy, w, tuple(self.x.shape), **self.kw) \
            if need_dx else None


class BatchNorm2d(Layer):
    """Spatial batch normalisation with scale (ones) and bias (zeros) in dtype; training
    updates the running mean and variance in place (momentum as cuDNN's factor), kept
    in the compute dtype (float32 for 16-bit layers)."""

    def __init__(self, C, *, momentum=0.1, eps=1e-5, dtype=np.float32, layout="NCHW"):
        super().__init__()
        self.layout = layout
        stats = np.float64 if np.dtype(dtype) == np.float64 else np.float32  # (its ops'
        self.params.update(scale=np.ones(C, dtype), bias=np.zeros(C, dtype))  # compute
        self.buffers.update(mean=np.zeros(C, stats), var=np.ones(C, stats))   # dtype)
        self.momentum, self.eps = momentum, eps

    def forward(self, x, train=False):
        p, b = self.params, self.buffers
        if not train:
            return nbdnn.batch_norm_infer(x, p["scale"], p["bias"], b["mean"], b["var"],
                                          eps=self.eps, layout=self.layout)
        self.x = x
        y, self.mean, self.invstd = nbdnn.batch_norm_train(
            x, p["scale"], p["bias"], b["mean"], b["var"], momentum=self.momentum,
            eps=self.eps, layout=self.layout)
        return y

    def backward(self, dy, need_dx=True):
        dx, self.grads["scale"], self.grads["bias"] = nbdnn.batch_norm_backward(
            dy, self.x, self.params["scale"], self.mean, self.invstd, layout=self.layout)
        return dx


class Activation(Layer):
    """y = activation(x, mode) for any of nbdnn.activation's modes."""

    def __init__(self, mode="relu", coef=None):
        super().__init__()
        self.mode, self.coef = mode, coef

    def forward(self, x, train=False):
        self.x = x
        self.y = nbdnn.activation(x, self.mode, coef=self.coef)
        return self.y

    def backward(self, dy, need_dx=True):
        return nbdnn.activation_backward(dy, self.x, self.y, self.mode, coef=self.coef)


def ReLU():
    return Activation("relu")


class _Pool(Layer):
    mode = "max"

    def __init__(self, kernel, stride=None, padding=0, *, layout="NCHW"):
        super().__init__()
        self.kernel, self.kw = kernel, dict(stride=stride, padding=padding, mode=self.mode,
                                            layout=layout)

    def forward(self, x, train=False):
        self.x = x
        return nbdnn.pool2d(x, self.kernel, **self.kw)

    def backward(self, dy, need_dx=True):
        return nbdnn.pool_backward(dy, self.x, self.kernel, **self.kw)


class MaxPool2d(_Pool):
    """Max pooling (stride defaults to the window)."""
    mode = "max"


class AvgPool2d(_Pool):
    """Average pooling, padding counted (cuDNN's avg)."""
    mode = "avg"


class GlobalAvgPool2d(Layer):
    """(N, C, H, W) -> (N, C, 1, 1) (NHWC: (N, H, W, C) -> (N, 1, 1, C)): an average
    pool over the whole map."""

    def __init__(self, *, layout="NCHW"):
        super().__init__()
        self.layout = layout

    def forward(self, x, train=False):
        self.x = x
        self.kernel = tuple(x.shape[1:3] if self.layout == "NHWC" else x.shape[2:])
        return nbdnn.pool2d(x, self.kernel, mode="avg", layout=self.layout)

    def backward(self, dy, need_dx=True):
        return nbdnn.pool_backward(dy, self.x, self.kernel, mode="avg", layout=self.layout)


class Flatten(Layer):
    """(N, ...) -> (N, prod(...)): a reshape, no copy."""

    def forward(self, x, train=False):
        self.shape = tuple(x.shape)
        return x.reshape(self.shape[0], int(np.prod(self.shape[1:])))

    def backward(self, dy, need_dx=True):
        return dy.reshape(self.shape)


class Linear(Layer):
    """y = x w^T + b; x (N, in), w (out, in) He-initialised."""

    def __init__(self, n_in, n_out, *, bias=True, seed=0, dtype=np.float32):
        super().__init__()
        self.params["w"] = _he(np.random.default_rng(seed), (n_out, n_in), n_in, dtype)
        if bias:
            self.params["b"] = np.zeros(n_out, dtype)

    def forward(self, x, train=False):
        self.x = x
        return nbdnn.matmul(x, self.params["w"], trans_b=True, bias=self.params.get("b"))

    def backward(self, dy, need_dx=True):
        res = nbdnn.matmul_backward(dy, self.x, self.params["w"], trans_b=True,
                                    bias="b" in self.params)
        self.grads["w"] = res[1]
        if "b" in self.params:
            self.grads["b"] = res[2]
        return res[0]


class Dropout(Layer):
    """Inverted dropout in training (identity otherwise). The offset is a counter
    buffer (one uint64 on the layer's device) that each call reads and advances by
    x.size on the device, so steps draw fresh masks, both backends draw the same ones,
    and so do the replays of a captured training step."""

    def __init__(self, p, *, seed=0):
        super().__init__()
        self.p, self.seed = p, seed
        self.buffers["offset"] = np.zeros(1, np.uint64)

    def forward(self, x, train=False):
        if not train or self.p == 0:
            self.mask = None
            return x
        y, self.mask = nbdnn.dropout(x, self.p, seed=self.seed, offset=self.buffers["offset"])
        return y

    def backward(self, dy, need_dx=True):
        return dy if self.mask is None else nbdnn.dropout_backward(dy, self.mask, self.p)
