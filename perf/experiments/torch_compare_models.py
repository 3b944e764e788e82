"""Where a converted model's float32 training departs from native's on CUDA (run AU:
torchvision ResNet-50's loss curve parted by 1.7e-3 after one SGD step): nbdnn.torch.compare
in training mode, TF32 off, each layer's output and output-gradient and each parameter's
gradient, printed where the relative difference passes --show; then the same after one
SGD step on both.

    PYTHONPATH=. python perf/experiments/torch_compare_models.py [--arch resnet50] [--batch 4]
"""
import argparse

import torch
import torchvision

import nbdnn.torch as nt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--show", type=float, default=1e-4)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    net = getattr(torchvision.models, args.arch)().cuda().train()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda")
    rows = nt.compare(net, x, file=open("/dev/null", "w"))
    worst = sorted(rows, key=lambda r: -r[3])
    print(f"{len(rows)} rows; largest relative differences:")
    for r in worst[:25]:
        print(f"  {r[0]:40} {r[1]:15} abs {r[2]:.3e} rel {r[3]:.3e}")
    print("in layer order, rows past --show:")
    for r in rows:
        if r[3] > args.show:
            print(f"  {r[0]:40} {r[1]:15} abs {r[2]:.3e} rel {r[3]:.3e}")


if __name__ == "__main__":
    main()
