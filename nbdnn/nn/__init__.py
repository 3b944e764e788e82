"""A small model layer built only from nbdnn ops: layers with forward and backward,
`Sequential` (and `resnet18`, `resnet50`; LayerNorm, MultiheadAttention and
TransformerBlock over (B, S, E) sequences: nbdnn/nn/transformer.py), a cross-entropy loss, SGD with momentum and
Adam, mixed precision (16-bit layers, float32 master weights, `LossScaler`:
nbdnn/nn/precision.py), on either backend.

A layer holds its parameters in `params` (name -> array) and, after `backward`, their
gradients in `grads`; `forward(x, train)` keeps what `backward(dy)` needs. Arrays are
NumPy on the CPU backend and numba device arrays after `model.to("cuda")`; every op
dispatches on the arrays it gets, so the same code runs on both. Initial weights come
from a NumPy generator seeded per layer, and dropout masks from nbdnn's counter-based
generator, so a seed gives the same network and the same masks on both backends.

    net = Sequential([Conv2d(1, 8, 3, padding=1, seed=0), BatchNorm2d(8), ReLU(),
                      MaxPool2d(2), Flatten(), Linear(8 * 4 * 4, 10, seed=1)])
    loss = CrossEntropyLoss()
    opt = SGD(net, lr=0.1, momentum=0.9)
    value = loss.forward(net.forward(x, train=True), onehot)   # a 1-element array
    net.backward(loss.backward())
    opt.step()

Mixed precision (nbdnn/nn/precision.py): layers take dtype= bfloat16 / float16 (or
`net.to_precision("bf16")`); the optimizers keep float32 master weights for 16-bit
parameters, the loss is float32, `LossScaler` scales fp16's loss with its skip and
growth decided on the device; `net.plan(batch, shape, loss=, optimizer=,
precision="bf16")` casts the model and plans the step (GraphedSteps). `layout="NHWC"`
builds channels-last layers (16-bit ones run sm_90's tensor-core convolutions);
`fold_batch_norm(net)` gives an inference copy with batch norms folded into the
convolutions and each ResNet block's residual ReLU fused into its last one.

On the CUDA backend `GraphedSteps(net, batch, (1, 8, 8), loss=loss, optimizer=opt)`
runs the same step on fixed buffers as a captured CUDA graph (nbdnn/nn/train.py):
`steps.step(x, onehot)` copies the batch in and replays the step for a microsecond of
host time a kernel. Everything a replay must see change lives in device arrays:
parameters, running statistics, optimizer state, dropout's offset counter, Adam's
b1**t and b2**t.

Several GPUs (nbdnn/nn/distributed.py): `model.to("cuda:1")` moves a model to a device
(its calls run there); `GradientAllReduce(model)` averages the gradients over a
torch.distributed process group, each layer's started as its backward ends, or over
CuPy's NCCL (`comm=nccl_communicator()`: the collectives captured with the step):
`train_step(..., allreduce=sync)`, `GraphedSteps(..., allreduce=sync)`.
"""
from .layers import (Activation, AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, GlobalAvgPool2d, Layer, Linear, MaxPool2d, ReLU, copy_into, device_of, move)  # noqa: F401
from .sequential import Sequential  # noqa: F401
from .blocks import BasicBlock, Bottleneck  # noqa: F401
from .transformer import (LayerNorm, MultiheadAttention, PositionalEmbedding, SequenceMean, TransformerBlock)  # noqa: F401
from .fold import FoldedBlock, FoldedConv, fold_batch_norm  # noqa: F401
from .models import resnet18, resnet50  # noqa: F401
from .precision import LossScaler  # noqa: F401
from .train import SGD, Adam, CrossEntropyLoss, GraphedSteps, forward_backward, train_step  # noqa: F401
from .distributed import GradientAllReduce, nccl_communicator  # noqa: F401
