"""Training pieces of nbdnn.nn (re-exported there): the cross-entropy loss, SGD and
Adam as nbdnn tensor ops, `train_step`, and `GraphedSteps`, which runs a model's inference and
training step on fixed input buffers and, on the CUDA backend, as captured graphs."""
import numpy as np

import nbdnn

from .layers import copy_into, device_of, move
from .precision import Masters, device_of_any, is_low


class CrossEntropyLoss:
    """Mean negative log-likelihood of log_softmax(logits) against one-hot targets
    (N, classes): forward returns the loss as a 1-element array (on the logits'
    device), backward the logits' gradient, softmax(logits) - onehot over N. 16-bit
    logits are cast to float32 first (the loss in float32, as mixed precision wants);
    the gradient goes back in the logits' dtype, multiplied by a LossScaler's scale
    before that cast when backward gets one. onehot: float32, or the logits' dtype."""

    def forward(self, logits, onehot):
        self.n = logits.shape[0]
        self.low = is_low(logits)
        self.dtype = str(logits.dtype).rpartition(".")[2]
        if self.low:
            logits = nbdnn.cast_tensor(logits, "float32")
            if is_low(onehot):
                onehot = nbdnn.cast_tensor(onehot, "float32")
        self.logp = nbdnn.softmax(logits, axis=1, algo="log")
        self.onehot = onehot
        prod = nbdnn.op_tensor("mul", self.logp, onehot)
        return nbdnn.reduce_tensor(prod, "add", None, keepdims=False, alpha=-1.0 / self.n)

    def backward(self, scaler=None):
        dlogp = nbdnn.scale_tensor(self.onehot, -1.0 / self.n)
        g = nbdnn.softmax_backward(dlogp, self.logp, axis=1, algo="log")
        if scaler is not None:
            g = scaler.scaled(g)
        return nbdnn.cast_tensor(g, self.dtype) if self.low else g


# GraphedSteps' captured training step with its buffers sharing one arena where their
# lifetimes allow (cuda/runtime/memory/reuse.py: the second step runs traced, the third is
# captured on the plan). Written without device time, tested in the
# simulator: off until a GPU run shows the same losses and the memory it saves.
REUSE_BUFFERS = False


# SGD's step through nbdnn.sgd_update (one launch a parameter) where the element-wise
# ops took four or five (its profile: 324 cast launches, 1.76 ms, besides the
# momentum and update ops); on (H200: the fused and element-wise steps
# agree, sanitizer clean, ResNet-50's step 0.39 ms in 161 launches). Off: the
# element-wise ops, kept as the test's second opinion.
FUSED_SGD = True


class SGD:
    """p -= lr * v, v = momentum * v + (g + weight_decay * p), per parameter, as one
    nbdnn.sgd_update call a parameter on its device (the velocities start at zero, so
    the first step sets v = g, as PyTorch's momentum buffer; make the optimizer after
    model.to(...)). 16-bit parameters update float32 master copies and are rounded from
    them in the same call; scaler: a LossScaler, whose skipped steps change nothing
    (nbdnn/nn/precision.py)."""

    def __init__(self, model, lr, *, momentum=0.0, weight_decay=0.0, scaler=None):
        self.model, self.lr, self.momentum, self.wd = model, lr, momentum, weight_decay
        self.velocity, self.scaler, self.masters = {}, scaler, Masters(scaler)

    def step(self):
        params = self.model.parameters()
        if not FUSED_SGD:
            return self._unfused_step(params)
        if self.scaler is None:  # the gradients as they are (sgd_update widens them)
            items, keep = self.masters.weights(params), None
        else:  # unscaled float32 gradients, zeroed where not finite, and the verdict
            items, keep = self.masters.gradients(params)
        for key, p, w, g in items:
            v = None
            if self.momentum:
                v = self.velocity.get(key)
                if v is None:  # zeros (the masters are finite)
                    v = self.velocity[key] = nbdnn.scale_tensor(w, 0.0)
            nbdnn.sgd_update(w, g, v, None if p is w else p, None, keep, lr=self.lr,
                             momentum=self.momentum, weight_decay=self.wd)
        if keep is not None:
            self.scaler.update(keep)

    def _unfused_step(self, params):
        """The step as element-wise ops (4-5 launches a parameter; FUSED_SGD off): the
        fused step's second opinion in tests/test_nn_precision.py."""
        items, keep = self.masters.gradients(params)
        for key, p, w, g in items:
            if self.wd:
                g = nbdnn.add_tensor(w, g, alpha=self.wd)
            if self.momentum:
                v = self.velocity.get(key)
                if keep is not None:  # v += keep ((momentum - 1) v + g), from zeros
                    if v is None:
                        v = self.velocity[key] = nbdnn.scale_tensor(g, 0.0)
                    t = nbdnn.add_tensor(v, g, alpha=self.momentum - 1.0)
                    nbdnn.op_tensor("mul", t, keep, beta=1.0, out=v)
                elif v is None:
                    v = self.velocity[key] = nbdnn.scale_tensor(g, 1.0)
                else:
                    nbdnn.add_tensor(g, v, beta=self.momentum, out=v)
                g = v
            if keep is None:
                nbdnn.add_tensor(g, w, alpha=-self.lr, out=w)
            else:
                nbdnn.op_tensor("mul", g, keep, alpha1=-self.lr, beta=1.0, out=w)
            self.masters.write_back(p, w)
        if keep is not None:
            self.scaler.update(keep)


class Adam:
    """Adam with bias correction (and L2 weight decay into g), in nbdnn tensor ops on
    the parameters' device: m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g*g,
    p -= lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps). b1**t and b2**t live
    in device arrays multiplied by b1 and b2 every step, so a captured step
    (nbdnn.cuda.Graph) corrects by the right t on every replay."""

    def __init__(self, model, lr=1e-3, *, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 scaler=None):
        self.model, self.lr, self.betas, self.eps, self.wd = model, lr, betas, eps, weight_decay
        self.state, self.shared = {}, None
        self.scaler, self.masters = scaler, Masters(scaler)

    def _shared(self, like):
        """[b1**t, b2**t, 1 - b1**t, 1 - b2**t, eps] as 1-element arrays on like's device."""
        if self.shared is None:
            self.shared = [move(np.full(1, v, np.float32 if is_low(like) else like.dtype),
                                device_of_any(like))
                           for v in (1.0, 1.0, 0.0, 0.0, self.eps, 1.0)]
        return self.shared

    def step(self):
        b1, b2 = self.betas
        params = self.model.parameters()
        if not params:
            return
        items, keep = self.masters.gradients(params)
        p1, p2, c1, c2, eps, one = self._shared(params[0][0].params[params[0][1]])
        for pw, b in ((p1, b1), (p2, b2)):  # b**t, advanced only by a kept step
            if keep is None:
                nbdnn.scale_tensor(pw, b, out=pw)
            else:  # pw *= 1 + keep (b - 1)
                nbdnn.op_tensor("mul", pw, nbdnn.add_tensor(keep, one, alpha=b - 1.0), out=pw)
        nbdnn.op_tensor("not", p1, out=c1)   # 1 - b1**t
        nbdnn.op_tensor("not", p2, out=c2)
        for key, p, w, g in items:
            if self.wd:
                g = nbdnn.add_tensor(w, g, alpha=self.wd)
            if key not in self.state:
                self.state[key] = (nbdnn.scale_tensor(g, 0.0), nbdnn.scale_tensor(g, 0.0))
            m, v = self.state[key]
            if keep is None:
                nbdnn.add_tensor(g, m, alpha=1 - b1, beta=b1, out=m)
                nbdnn.op_tensor("mul", g, g, alpha2=1 - b2, beta=b2, out=v)
            else:  # m += keep (1 - b1)(g - m), v += keep (1 - b2)(g g - v)
                dm = nbdnn.add_tensor(m, g, alpha=b1 - 1.0, beta=1.0 - b1)
                nbdnn.op_tensor("mul", dm, keep, beta=1.0, out=m)
                dv = nbdnn.add_tensor(v, nbdnn.op_tensor("mul", g, g), alpha=b2 - 1.0,
                                      beta=1.0 - b2)
                nbdnn.op_tensor("mul", dv, keep, beta=1.0, out=v)
            d = nbdnn.add_tensor(eps, nbdnn.op_tensor("sqrt", nbdnn.op_tensor("div", v, c2)))
            step = nbdnn.op_tensor("div", nbdnn.op_tensor("div", m, c1), d, alpha1=self.lr)
            if keep is None:
                nbdnn.add_tensor(step, w, alpha=-1.0, out=w)
            else:
                nbdnn.op_tensor("mul", step, keep, alpha1=-1.0, beta=1.0, out=w)
            self.masters.write_back(p, w)
        if keep is not None:
            self.scaler.update(keep)


def train_step(model, loss, optimizer, x, target, allreduce=None):
    """One training step: forward, loss, backward, optimizer update; returns the loss
    (a 1-element array on the model's device). The optimizer's LossScaler, if any,
    scales the loss's gradient (nbdnn/nn/precision.py). allreduce: a GradientAllReduce
    (nbdnn/nn/distributed.py) that averages the gradients over the processes, each
    layer's started as its backward ends, all done before the optimizer."""
    value = forward_backward(model, loss, optimizer, x, target, allreduce)
    if allreduce is not None:
        allreduce.wait()
    optimizer.step()
    return value


def forward_backward(model, loss, optimizer, x, target, allreduce=None):
    """train_step's forward, loss and backward (allreduce's collectives started, not
    waited for); the loss."""
    value = loss.forward(model.forward(x, train=True), target)
    scaler = getattr(optimizer, "scaler", None)
    dy = loss.backward(scaler) if scaler is not None else loss.backward()
    if allreduce is None:
        model.backward(dy, need_dx=False)
    elif hasattr(model, "seq"):  # (a Sequential: each layer's as its backward ends)
        model.backward(dy, need_dx=False, after=allreduce.layer_done)
    else:
        model.backward(dy, need_dx=False)
        allreduce.layer_done(model)
    return value


class GraphedSteps:
    """A model's inference and training step for one batch size, with inputs copied
    into buffers allocated once. On the CUDA backend each is captured as a CUDA graph
    (nbdnn.cuda.Graph) and replayed: the activations, gradients and workspaces are
    allocated once, at capture, and owned by the graph, and a step costs about a
    microsecond of host time a kernel. Eagerly (graph=False, or the CPU backend) every
    call allocates its intermediates as plain calls do.

        steps = nn.GraphedSteps(model, 64, (1, 8, 8), loss=nn.CrossEntropyLoss(),
                                optimizer=nn.SGD(model, 0.05, momentum=0.9))
        loss = steps.step(x_batch, onehot_batch)   # host or device arrays, copied in
        logits = steps.forward(x_batch)            # eval mode

    The first `step` runs eagerly (it creates the optimizer's state), the second is
    captured while it runs, later ones replay; `forward` is captured on its first
    call. reuse=True (default REUSE_BUFFERS): the second step runs eagerly while its
    allocations and launches are traced, the third is captured with every buffer
    whose last kernel has run shared with later ones (one arena of `arena_bytes`
    where the traced step allocated `traced_bytes`; cuda/runtime/memory/reuse.py): after a
    replay only the loss is readable, not the activations a layer holds. Results
    (the loss, the logits) are these steps' own buffers, rewritten by the next call:
    copy what you keep. Parameters, running statistics, the optimizer's
    state and dropout's counter are read and updated in place, so a step and a
    forward see each other's effects. Make them after `model.to(device)`:
    moving the model afterwards leaves them on the old arrays. graph=False runs
    the same calls eagerly (the only mode on the CPU backend).

    allreduce (a GradientAllReduce, nbdnn/nn/distributed.py): data-parallel steps, no
    buffer reuse. Over torch.distributed with graphs: two replayed graphs (forward and
    backward; the optimizer) around the collectives, which run eagerly
    (torch.distributed's NCCL streams are outside what nbdnn.cuda.Graph records); over
    a cupy.cuda.nccl communicator: one graph, the collectives captured in it; eagerly:
    train_step's all-reduces, overlapped with the backward."""

    def __init__(self, model, batch_size, input_shape, *, loss=None, optimizer=None,
                 graph=None, reuse=None, allreduce=None):
        params = [m.params[k] for m, k in model.parameters()]
        self.device = device_of(params[0]) if params else "cpu"
        # (a NumPy dtype also for torch parameters: CUDA bfloat16 arrays are torch tensors)
        self.dtype = np.dtype(str(params[0].dtype).rpartition(".")[2]) if params else \
            np.dtype(np.float32)
        if graph is None:
            graph = self.device.startswith("cuda")
        if graph and not self.device.startswith("cuda"):
            raise nbdnn.BadParamError("GraphedSteps: graph=True needs the model on 'cuda'")
        self.model, self.loss, self.optimizer, self.graph = model, loss, optimizer, graph
        self.reuse = REUSE_BUFFERS if reuse is None else bool(reuse)
        self.allreduce = allreduce
        if allreduce is not None:
            self.reuse = False
        self._trace = None
        self.x = move(np.zeros((batch_size,) + tuple(input_shape), self.dtype), self.device)
        self.target = None
        self._graphs, self._results, self._steps = {}, {}, 0

    def _into(self, buf, a):
        if tuple(a.shape) != tuple(buf.shape):
            raise nbdnn.ShapeError(f"GraphedSteps: expected an array of shape {tuple(buf.shape)}, "
                                   f"got {tuple(a.shape)}")
        copy_into(buf, a)

    def _run(self, name, fn, eager_first):
        """fn() eagerly, or captured on its first graph call and replayed after."""
        g = self._graphs.get(name)
        if g is not None:
            g.replay()
        elif not self.graph or eager_first:
            self._results[name] = fn()
        elif self.reuse and name == "step" and self._trace is None:
            from ..cuda.runtime.memory.reuse import Trace  # (a traced eager step: the plan)
            trace = Trace()
            with trace:
                self._results[name] = fn()
            self._trace = trace  # (only a whole run's trace: a failed one traces again)
        else:
            from ..cuda import Graph
            arena = None
            if self.reuse and name == "step":
                self.traced_bytes = self._trace.nbytes
                arena = self._trace.plan(keep=[self._results[name]])
                self._trace = None
            g = Graph()
            with g.capture(arena):
                self._results[name] = fn()
            self._graphs[name] = g
            self.arena_bytes = arena.nbytes if arena is not None else 0
        return self._results[name]

    def forward(self, x):
        """The model's output in eval mode for a batch x (GraphedSteps' own buffer)."""
        self._into(self.x, x)
        return self._run("forward", lambda: self.model.forward(self.x, train=False), False)

    def step(self, x, target):
        """One training step (forward, loss, backward, optimizer); the loss buffer."""
        if self.loss is None or self.optimizer is None:
            raise nbdnn.BadParamError("GraphedSteps.step needs loss= and optimizer=")
        if self.target is None:  # (float32 for a 16-bit model: its loss is float32)
            tdt = np.float32 if self.dtype.name in ("float16", "bfloat16") else self.dtype
            self.target = move(np.zeros(tuple(target.shape), tdt), self.device)
        self._into(self.x, x)
        self._into(self.target, target)
        self._steps += 1
        first = self._steps == 1
        if self.allreduce is None:
            return self._run("step", lambda: train_step(self.model, self.loss, self.optimizer,
                                                        self.x, self.target), first)
        if not self.graph or self.allreduce.capturable:  # (eager; or one graph, its
            # collectives captured on nbdnn's stream: a cupy.cuda.nccl communicator)
            return self._run("step", lambda: train_step(
                self.model, self.loss, self.optimizer, self.x, self.target, self.allreduce),
                first)
        value = self._run("step", lambda: forward_backward(
            self.model, self.loss, self.optimizer, self.x, self.target), first)
        self.allreduce()  # (every gradient: the graph's buffers, the same every replay)
        self._run("update", self.optimizer.step, first)
        return value
