"""`nbdnn demo`: train a small CNN on scikit-learn's bundled digits (1797 8x8 images,
no download) with nbdnn.nn, on the CPU backend, the CUDA backend or both, and report
time per epoch, images/s and test accuracy. `--model transformer` trains a small
transformer on the same digits read as sequences of 8 pixel rows: a linear
embedding of each row (8 -> 32), a learned position embedding, one pre-norm
TransformerBlock (4 heads), layer norm, the mean over the rows, linear (32 -> 10);
Adam. It reaches ~96% in 10 epochs (the CNN 98.9% in 8).

The network: conv 3x3 (1 -> 16) - BN - ReLU - max pool 2, conv 3x3 (16 -> 32) - BN -
ReLU - max pool 2, dropout 0.1, linear (128 -> 10); SGD with momentum, batch 64
(the last partial batch of an epoch is dropped, so every step has one shape). The same
seed gives the same weights, batches and dropout masks on both backends, so their
loss curves agree to float32 rounding: with both, the demo prints the largest
difference over the first epoch, and --plot draws the two curves.

With --mode graph (CUDA) the demo captures one training step as a CUDA graph
(nbdnn.cuda.Graph) and replays it for every later step: same kernels, same results
bit for bit, a fraction of the host time.

    nbdnn demo [--backend cpu|cuda|both] [--mode eager|graph|both] [--epochs 8]
               [--precision fp32|bf16|fp16] [--model cnn|transformer] [--plot loss.png]
"""
import argparse
import os
import sys
import time

import numpy as np

from . import nn
from ._files import atomic_write

CLASSES = 10


TRAIN_IMAGES = 1797 - int(1797 * 0.2)  # load_digits' training split


def load_digits(seed=0, test_fraction=0.2):
    """(x_train, y_train, x_test, y_test): x (n, 1, 8, 8) float32 in [0, 1], y ints."""
    try:
        from sklearn.datasets import load_digits as sk_digits
    except ImportError:
        sys.exit("nbdnn demo needs scikit-learn for its bundled digits dataset: "
                 "pip install scikit-learn (or nbdnn[demo])")
    d = sk_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], d.target[train], x[test], d.target[test]


PRECISIONS = {"fp32": np.float32, "bf16": "bfloat16", "fp16": np.float16}


def digits_cnn(seed=0, dtype=np.float32):
    return nn.Sequential([
        nn.Conv2d(1, 16, 3, padding=1, seed=seed, dtype=dtype), nn.BatchNorm2d(16, dtype=dtype),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, seed=seed + 1, dtype=dtype),
        nn.BatchNorm2d(32, dtype=dtype), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.1, seed=seed + 2), nn.Flatten(),
        nn.Linear(32 * 2 * 2, CLASSES, seed=seed + 3, dtype=dtype)])


def digits_transformer(seed=0, dtype=np.float32, E=32, heads=4):
    """x (n, 8, 8): 8 rows of 8 pixels, a sequence of 8 tokens."""
    return nn.Sequential([
        nn.Linear(8, E, seed=seed, dtype=dtype), nn.PositionalEmbedding(8, E, seed=seed + 1,
                                                                        dtype=dtype),
        nn.TransformerBlock(E, heads, seed=seed + 2, dtype=dtype), nn.LayerNorm(E, dtype=dtype),
        nn.SequenceMean(), nn.Linear(E, CLASSES, seed=seed + 6, dtype=dtype)])


MODELS = {"cnn": (digits_cnn, 0.05), "transformer": (digits_transformer, 0.003)}


def _progress(epoch, epochs, step, steps, loss, rate):
    done = int(30 * step / steps)
    sys.stderr.write(f"\r  epoch {epoch + 1}/{epochs} [{'#' * done}{'.' * (30 - done)}] "
                     f"loss {loss:.4f}  {rate:,.0f} img/s ")
    sys.stderr.flush()


def accuracy(model, x, y, device, batch=256):
    hits = 0
    for i in range(0, len(x), batch):
        logits = nn.move(model.forward(nn.move(x[i:i + batch], device), train=False), "cpu")
        hits += int(np.sum(np.argmax(logits, axis=1) == y[i:i + batch]))
    return hits / len(x)


def train(device, epochs=8, batch=64, lr=None, momentum=0.9, seed=0, quiet=False,
          mode="eager", precision="fp32", model="cnn"):
    """Train on one backend through GraphedSteps (nbdnn.nn): eagerly, or (CUDA only)
    replaying one captured training step (the first step runs eagerly and creates
    the optimizer's velocities, the second is captured while it runs, every later
    step copies its batch into the steps' buffers and replays). precision: "fp32",
    "bf16" (16-bit layers, float32 master weights, the loss in float32) or "fp16" (the
    same with a LossScaler). model: "cnn" (SGD with momentum, lr 0.05 unless given) or
    "transformer" (the rows as a sequence; Adam, lr 0.003). Returns a dict with the
    per-step losses, seconds per epoch, images/s and test accuracy."""
    if mode == "graph" and device != "cuda":
        raise ValueError("graph mode needs the CUDA backend")
    dtype = np.dtype(PRECISIONS[precision])
    xtr, ytr, xte, yte = load_digits(seed)
    xtr, xte = xtr.astype(dtype), xte.astype(dtype)
    if model == "transformer":
        xtr, xte = xtr.reshape(-1, 8, 8), xte.reshape(-1, 8, 8)
    onehot = np.eye(CLASSES, dtype=np.float32)
    build, default_lr = MODELS[model]
    lr = default_lr if lr is None else lr
    net = build(seed, dtype).to(device)
    scaler = nn.LossScaler() if precision == "fp16" else None
    opt = nn.Adam(net, lr, scaler=scaler) if model == "transformer" else \
        nn.SGD(net, lr, momentum=momentum, scaler=scaler)
    run = nn.GraphedSteps(net, batch, xtr.shape[1:], loss=nn.CrossEntropyLoss(),
                          optimizer=opt, graph=mode == "graph")
    steps, losses, epoch_times = len(xtr) // batch, [], []
    for epoch in range(epochs):
        order = np.random.default_rng(seed + 1000 + epoch).permutation(len(xtr))
        t0 = time.perf_counter()
        for s in range(steps):
            idx = order[s * batch:(s + 1) * batch]
            loss = run.step(xtr[idx], onehot[ytr[idx]])
            losses.append(float(nn.move(loss, "cpu").reshape(())))
            if not quiet:
                _progress(epoch, epochs, s + 1, steps, losses[-1],
                          (s + 1) * batch / (time.perf_counter() - t0))
        epoch_times.append(time.perf_counter() - t0)
    if not quiet:
        sys.stderr.write("\n")
    per_epoch = float(np.median(epoch_times))
    return {"device": device, "mode": mode, "precision": precision, "losses": losses,
            "epoch_s": per_epoch, "model": model,
            "images_s": steps * batch / per_epoch, "accuracy": accuracy(net, xte, yte, device),
            "steps_per_epoch": steps}


def _positive(kind):
    def parse(text):
        v = kind(text)
        if not (v > 0 and v < float("inf")):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return v
    return parse


def _row(r):
    return (f"{r['device']:<8} {r['mode']:<6} {r['precision']:<5} {r['epoch_s']:8.3f} "
            f"{r['images_s']:10,.0f} {r['accuracy']:9.2%}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="nbdnn demo", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "cuda", "both"), default="cpu",
                    help="where to train (without a GPU, cuda and both run the CPU alone)")
    ap.add_argument("--epochs", type=_positive(int), default=8)
    ap.add_argument("--batch", type=_positive(int), default=64)
    ap.add_argument("--lr", type=_positive(float), default=None,
                    help="learning rate (default: 0.05 for the CNN, 0.003 for the transformer)")
    ap.add_argument("--model", choices=tuple(MODELS), default="cnn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("eager", "graph", "both"), default="eager",
                    help="CUDA backend: eager calls, or replaying a captured training step")
    ap.add_argument("--precision", choices=tuple(PRECISIONS), default="fp32",
                    help="fp32, or bf16 / fp16 layers with float32 master weights (fp16: "
                         "dynamic loss scaling)")
    ap.add_argument("--plot", help="draw the loss curves to this image (needs matplotlib)")
    args = ap.parse_args(argv)
    if args.plot:  # (a usage error now, not after training)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--plot needs matplotlib (pip install 'nbdnn[demo]')")
    devices = ("cpu", "cuda") if args.backend == "both" else (args.backend,)
    modes = ("eager", "graph") if args.mode == "both" else (args.mode,)
    jobs = [(d, m) for d in devices for m in modes if d == "cuda" or m == "eager"]
    if not jobs:
        ap.error("graph mode needs the CUDA backend (--backend cuda or both)")
    from .cuda import DRIVER_STATUS, SIMULATOR
    if SIMULATOR and any(d == "cuda" for d, _ in jobs):
        print(f"no GPU ({DRIVER_STATUS}): the CUDA backend would run in numba's simulator, "
              "far too slowly to train; training on the CPU backend only", file=sys.stderr)
        jobs = [("cpu", "eager")]
    if args.batch > TRAIN_IMAGES:
        ap.error(f"--batch {args.batch} is larger than the training set ({TRAIN_IMAGES} images)")
    runs = []
    print(f"{'backend':<8} {'mode':<6} {'prec':<5} {'s/epoch':>8} {'images/s':>10} "
          f"{'test acc':>9}")
    for device, mode in jobs:
        print(f"training on {device}, {mode}", file=sys.stderr)
        runs.append(train(device, args.epochs, args.batch, args.lr, seed=args.seed,
                          mode=mode, precision=args.precision, model=args.model))
        print(_row(runs[-1]), flush=True)  # as each run ends: a long one loses nothing
    n = runs[0]["steps_per_epoch"]
    for a, b in zip(runs, runs[1:]):
        diff = np.max(np.abs(np.subtract(a["losses"][:n], b["losses"][:n])))
        print(f"largest |loss {a['device']} {a['mode']} - loss {b['device']} {b['mode']}| "
              f"over the first epoch ({n} steps): {diff:.2e}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in runs:
            ax.plot(r["losses"], label=f"{r['device']} {r['mode']}", lw=1)
        ax.set(xlabel="step", ylabel="training loss", yscale="log",
               title=f"digits {args.model}, nbdnn.nn, same seed")
        ax.legend()
        with atomic_write(args.plot) as f:
            fig.savefig(f, dpi=120, bbox_inches="tight",
                        format=os.path.splitext(args.plot)[1][1:] or "png")
        print(f"loss curves: {args.plot}")
    return runs


if __name__ == "__main__":
    main()
