"""Every tensor-core GEMM code path once, small, checked against PyTorch in float64: for
compute-sanitizer (memcheck, racecheck), which slows a kernel down hundreds of times,
so `nbdnn check`'s many examples do not finish in a device call). Paths: 16-bit in the
four operand majors (the persistent kernel, no split), with the full epilogue, split-K
(chunk kernel + ordered sum), float32 math tf32 and 3xtf32 (tf32_parts + the tf32
kernel), a batch broadcast both ways, the sm_80-89 mma.sync kernel (forced); then the
tensor maps the default does not use (wgmma_gemm.OWN_MAPS on: the blocks make them;
off: the host encodes them) plain, split-K and batched, and the epilogue both ways
(wgmma_gemm.TMA_STORE: direct stores, TMA stores, the latter with both kinds of maps;
then the other side of the switches the default paths ran one way ("[alt]":
TMA_STORE_F32, SKINNY_TILE, LEAN_SETUP), and the switches written but not yet run
("[knob]": split_k.WIDTHS with 192). Prints one line a path and exits 1 on a miss;
`--only WORD` runs the paths whose label holds WORD (`--only maps`, `--only store`,
`--only "[alt]"`, `--only "[knob]"`).

    PYTHONPATH=. compute-sanitizer --tool racecheck python3 perf/tools/tc_paths.py
"""
import sys

import torch

import nbdnn
from nbdnn.cuda.runtime.launch.kernel import launched


def _case(label, shapes, dtype, ta=False, tb=False, tol=2e-2, **kw):
    if ONLY and ONLY not in label:
        return True
    g = torch.Generator().manual_seed(len(label))
    (ash, bsh) = shapes
    a = torch.rand(ash, generator=g) - 0.5
    b = torch.rand(bsh, generator=g) - 0.5
    want = torch.matmul(a.double(), b.double())
    if kw.get("bias"):
        kw["bias"] = (torch.rand(bsh[-1], generator=g) - 0.5).to(dtype).cuda()
        want = want + kw["bias"].double().cpu()
    if kw.get("activation") == "relu":
        want = want.clamp(min=0)
    da = (a.transpose(-1, -2).contiguous() if ta else a).to(dtype).cuda()
    db = (b.transpose(-1, -2).contiguous() if tb else b).to(dtype).cuda()
    with launched() as names:
        c = nbdnn.matmul(da, db, trans_a=ta, trans_b=tb, **kw)
        torch.cuda.synchronize()
    err = float((c.double().cpu() - want).abs().max() / want.abs().max())
    ok = err < tol and any(n.startswith(("wgmma_gemm", "mma_gemm")) for n in names)
    print(f"{'ok ' if ok else 'BAD'} {label:28} rel err {err:.1e}  {' '.join(names)}", flush=True)
    return ok


def main():
    oks = []
    for dt in (torch.bfloat16, torch.float16):
        for ta in (False, True):
            for tb in (False, True):
                oks.append(_case(f"{dt} ta={ta:d} tb={tb:d}", ((200, 136), (136, 264)), dt,
                                 ta, tb))
    bf = torch.bfloat16
    oks.append(_case("bf16 bias+gelu", ((130, 64), (64, 520)), bf, bias=True, activation="relu"))
    oks.append(_case("bf16 split-K", ((64, 2048), (2048, 264)), bf))
    oks.append(_case("bf16 batches broadcast", ((2, 1, 72, 64), (3, 64, 136)), bf))
    from nbdnn.cuda import matmul as mm
    with mm.forced("mma_sync"):  # the sm_80-89 kernel (mma_gemm.py), on this GPU
        for ta, tb in ((False, False), (True, True)):
            oks.append(_case(f"mma.sync bf16 ta={ta:d} tb={tb:d}", ((200, 136), (136, 264)),
                             bf, ta, tb, bias=True, activation="relu"))
    for mode in ("tf32", "3xtf32"):
        oks.append(_case(f"float32 {mode}", ((200, 100), (100, 261)), torch.float32, True,
                         False, 1e-3, math=mode))
        oks.append(_case(f"float32 {mode} split-K", ((64, 2048), (2048, 264)), torch.float32,
                         tol=1e-3, math=mode))
    from nbdnn.cuda.matmul.tensor_core_gemm import wgmma_gemm
    default = wgmma_gemm.OWN_MAPS  # the paths above ran with it; now the other maps
    wgmma_gemm.OWN_MAPS = not default
    other = "own maps" if not default else "host maps"
    oks.append(_case(f"bf16 {other} ta=1 tb=0", ((200, 136), (136, 264)), bf, True, False))
    oks.append(_case(f"bf16 {other} split-K", ((64, 2048), (2048, 264)), bf))
    oks.append(_case(f"bf16 {other} batches", ((2, 1, 72, 64), (3, 64, 136)), bf))
    wgmma_gemm.OWN_MAPS = default
    # C by direct stores, then through staging tiles and TMA stores (staged_store.py)
    stores = wgmma_gemm.TMA_STORE
    for ts in (False, True):
        wgmma_gemm.TMA_STORE = ts
        kind = "tma store" if ts else "direct store"
        oks.append(_case(f"bf16 {kind} ta=0 tb=0", ((200, 136), (136, 264)), bf))
        oks.append(_case(f"fp16 {kind} ta=1 tb=1 bias+relu", ((136, 64), (64, 520)),
                         torch.float16, True, True, bias=True, activation="relu"))
        oks.append(_case(f"bf16 {kind} batches", ((2, 1, 72, 64), (3, 64, 136)), bf))
    wgmma_gemm.OWN_MAPS = not default
    oks.append(_case(f"bf16 tma store {other}", ((200, 136), (136, 264)), bf))
    wgmma_gemm.OWN_MAPS, wgmma_gemm.TMA_STORE = default, stores
    # the switches the paths above ran one way (their defaults), the other way ("[alt]")
    f32 = wgmma_gemm.TMA_STORE_F32  # float32 C (tf32's C, split-K's chunks) staged or not
    wgmma_gemm.TMA_STORE_F32 = not f32
    kind = "f32 tma store" if not f32 else "f32 direct store"
    oks.append(_case(f"float32 tf32 {kind} bias+relu [alt]", ((200, 100), (100, 264)),
                     torch.float32, False, True, 1e-3, math="tf32", bias=True,
                     activation="relu"))
    oks.append(_case(f"bf16 split-K {kind} [alt]", ((2, 64, 2048), (2, 2048, 264)), bf))
    wgmma_gemm.TMA_STORE_F32 = f32
    skinny, lean = wgmma_gemm.SKINNY_TILE, wgmma_gemm.LEAN_SETUP  # M <= 64: 64 x 256 tiles
    wgmma_gemm.SKINNY_TILE = None if skinny else wgmma_gemm.SKINNY
    wgmma_gemm.LEAN_SETUP = not lean
    kind = ("128-row tile" if skinny else "skinny tile") + (" full setup" if lean else " lean")
    oks.append(_case(f"bf16 {kind} ta=1 tb=0 bias+relu [alt]", ((40, 136), (136, 264)),
                     bf, True, False, bias=True, activation="relu"))
    oks.append(_case(f"fp16 {kind} split-K [alt]", ((2, 64, 2048), (2, 2048, 264)),
                     torch.float16))
    wgmma_gemm.SKINNY_TILE, wgmma_gemm.LEAN_SETUP = skinny, lean
    from nbdnn.cuda.matmul import split_k  # the 192-wide tile where it fits a wave better
    widths, split_k.WIDTHS = split_k.WIDTHS, (256, 192)
    oks.append(_case("bf16 192-wide tile ta=0 tb=1 [knob]", ((1000, 136), (136, 3000)), bf,
                     False, True))
    oks.append(_case("fp16 192-wide tile bias+relu [knob]", ((1000, 64), (64, 3000)),
                     torch.float16, bias=True, activation="relu"))
    split_k.WIDTHS = widths
    narrow, split_k.NARROW = split_k.NARROW, True  # 64- and 128-wide tiles (on since AN)
    oks.append(_case("bf16 64-wide tile ta=0 tb=1", ((20000, 96), (96, 64)), bf,
                     False, True))
    oks.append(_case("fp16 128-wide tile bias+relu", ((6000, 200), (200, 120)),
                     torch.float16, bias=True, activation="relu"))
    # a 1x1 filter gradient's dW (256 x 64) = dy^T x: two 64-wide tiles, split-K
    oks.append(_case("bf16 64-wide split-K ta=1", ((256, 8192), (8192, 64)), bf, True))
    oks.append(_case("float32 tf32 64-wide tile", ((20000, 96), (96, 64)), torch.float32,
                     False, True, 1e-3, math="tf32"))
    oks.append(_case("float32 tf32 64-wide split-K", ((256, 8192), (8192, 64)),
                     torch.float32, False, True, 1e-3, math="tf32"))
    split_k.NARROW = narrow
    sys.exit(0 if all(oks) else 1)


ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None

if __name__ == "__main__":
    main()
