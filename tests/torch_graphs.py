"""The capture recipe the nbdnn.torch graph tests share (PyTorch's own: warm-up on a
side stream, gradients set to None so the capture allocates them in its pool)."""
import torch

import nbdnn.torch as nt


def captured_step(step, model, twin, warm_up=2):
    """step(model) and step(twin) `warm_up` times on a side stream, then step(model)
    captured by torch.cuda.graph: (the graph, step's static result)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm_up):
            step(model)
            step(twin)
    torch.cuda.current_stream().wait_stream(s)
    nt.fresh_accumulators(model)  # (nodes eager steps may have left: nbdnn/torch/capture.py)
    for p in model.parameters():  # (graph-owned gradients: allocated inside the capture)
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(model)
    return graph, static
