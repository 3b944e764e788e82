"""Where a tensor-core GEMM block's fixed cost goes (issue 23, skinny rows): the wgmma
kernel's generated source with %globaltimer stamps inserted (ns, the GPU's global
clock) at the prologue's start and end, the first stage's arrival, the end of the
first tile's k-loop, the epilogue's end and the stores' drain, stamped by the producer
thread (0, 1) and consumer warpgroup 1's thread 0 (2-5); beside them the producer's
setmaxnreg, its first batch-table read and first TMA issue, the consumers' setmaxnreg. Run AH: one 128 x 256 tile
of one k-tile takes 6.3 us of kernel time against cuBLAS's 2.0.

Stamps go to the end of the blocks' map-slot workspace (wgmma_gemm allocates it;
slot_words is widened here), 16 words a block. Prints, per shape, the kernel's CUPTI
duration and the medians over blocks of each interval, and the span from the first
block's start to the last block's end.

    PYTHONPATH=. python3 perf/experiments/gemm_timeline.py [--full]

Found (run AH, H200, `perf/history/2026-12-03-h200-runAH-call4-5-timeline.log`; one
tile of one k-tile, 5.6 us from the first stamp to the last of 6.5 us of kernel): the
prologue (own tensor maps, barriers) 0.8-1.0 us; then the producer needs 1.8 us before
its first TMA copy, nearly all of it the k-loop's setup: tile_of's int64 divisions and
the batch table's global read (offs[2z], offs[2z + 1]); the first stage lands 0.5 us
after its TMA issue; one k-tile 0.5-0.8 us; the epilogue 1.0-1.3 us; the TMA stores'
drain 0.3-0.5 us. Every shape pays the same ~3.3 us from the prologue's end to its
first stage (4096^3 and 1000 x 3000 x 2040 too). %globaltimer ticks every 256 ns here
(every stamp is a multiple): medians over blocks. Written after the device time, not
yet run: a stamp before the table read (splits the setup's arithmetic from the read),
and --lean (wgmma_gemm.LEAN_SETUP: no table read for one matrix, 32-bit tile
arithmetic; the PTX already takes div.u32 when the int64 operands fit, so the read is
the suspect). Run AI (`-runAI-call1-knobs.log`): with the lean setup the first stage
still lands 1.8-2.3 us after the prologue, the first TMA issued 1.3-1.5 us after it;
the one-tile kernel lost ~1 us elsewhere. The lean setup is shipped since: --full runs
the 64-bit setup with the table read. Its split-K row printed garbage for the epilogue's
end (the chunk kernel's direct stores had no stamp there); the stamps now also match the
64-row tile's lines, and direct stores stamp the epilogue's end where they finish.
"""
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic
from torch.profiler import ProfilerActivity, profile

import nbdnn
from nbdnn.cuda.matmul import wgmma_gemm as W
from nbdnn.cuda.tensorcore.asm import inline_asm
from nbdnn.ops import _plan

STAMPS = ["start", "prologue end", "first stage in", "k-loop end", "epilogue end",
          "stores drained"]
SIDE = ["producer after setmaxnreg", "batch table read", "first TMA issued",
        "consumer after setmaxnreg", "tile setup done (before the table read)"]


@intrinsic
def globaltimer(typingctx):
    """The GPU's global nanosecond clock. PTX: `mov.u64 $0, %globaltimer;`"""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, ir.IntType(64), [], "mov.u64 $0, %globaltimer;", "=l")
    return types.int64(), codegen


def _probe(indent, k, cond):
    where = f"slots[{W.slot_words(True) - 16} * cuda.gridDim.x + 16 * cuda.blockIdx.x + {k}]"
    return [f"{indent}if {cond}:", f"{indent}    {where} = globaltimer()"]


def stamped(source):
    """W.source with the stamps inserted (matched on the generated lines)."""
    def src(*args, **kw):
        name, text = source(*args, **kw)
        out = []
        lines = text.split("\n")
        consumer = drained = False
        for n, line in enumerate(lines):
            if line == "        setmaxnreg_inc(232)":
                consumer = True
            # (the consumer's first operand line and first place line: both tiles' forms)
            if consumer and line.startswith("                sa = base"):
                out += _probe(" " * 16, 2, "i == 0 and w == 0 and it == 0")
            if line.startswith("            r = m0 + "):
                out += _probe(" " * 12, 3, "i == 0 and w == 0 and t == cuda.blockIdx.x")
            if consumer and line == "        if i == 0:" and n + 1 < len(lines) and \
                    "bulk_wait(0)" in lines[n + 1]:
                out += _probe(" " * 8, 4, "i == 0 and w == 0")
                drained = True
            out.append(line)
            if line == "        setmaxnreg_dec(40)":
                out += _probe(" " * 8, 6, "tid == 0")
            if line == "        setmaxnreg_inc(232)":
                out += _probe(" " * 8, 9, "tid == 128")
            if line.startswith("                za = I32(offs[2 * z])"):
                out += _probe(" " * 16, 10, "it == 0")
            if line.startswith("                zb = I32(offs[2 * z + 1])"):
                out += _probe(" " * 16, 7, "it == 0")
            if line == "                    it += 1" and not consumer:
                out += _probe(" " * 20, 8, "it == 1")
            if line == "    tid = cuda.threadIdx.x":
                out += _probe("    ", 0, "tid == 0")
            if line == "    cuda.syncthreads()":
                out += _probe("    ", 1, "tid == 0")
        if not drained:  # direct stores: the epilogue ends when its stores are issued
            out += _probe(" " * 8, 4, "i == 0 and w == 0")
        out += _probe(" " * 8, 5, "i == 0 and w == 0")
        return name, "\n".join(out) + "\n"
    return src


def main():
    import sys
    W.LEAN_SETUP = "--full" not in sys.argv  # tile_order.py's lean setup (shipped since AI)
    W.source = stamped(W.source)
    compile_source = W.compile_source
    W.compile_source = lambda name, src, ns, **kw: compile_source(
        name, src, dict(ns, globaltimer=globaltimer), **kw)
    words = W.slot_words
    W.slot_words = lambda store: words(True) + 16  # stamps after every block's slots
    W._built.cache_clear()
    captured = []
    empty = W.empty

    def grab(like, shape, dtype):
        arr = empty(like, shape, dtype)
        if dtype == "int64":
            captured.append(arr)
        return arr
    W.empty = grab
    for M, N, K in [(128, 256, 64), (128, 256 * 132, 64), (64, 4096, 4096),
                    (1000, 3000, 2040)]:
        a = torch.randn(M, K, device="cuda").bfloat16()
        b = torch.randn(K, N, device="cuda").bfloat16()
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        _plan.clear()
        nbdnn.matmul(a, b, out=c)  # compile
        torch.cuda.synchronize()
        _plan.clear()  # (a replayed plan would allocate no slots here)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            captured.clear()
            nbdnn.matmul(a, b, out=c)
            torch.cuda.synchronize()
        dur = {ev.key: ev.device_time_total for ev in prof.key_averages()
               if ev.device_time_total > 0}
        slots = captured[-1].cpu().numpy()
        grid = len(slots) // W.slot_words(True)
        st = slots[-16 * grid:].reshape(grid, 16)[:, :len(STAMPS)].astype(np.float64)
        st[st == 0] = np.nan  # (a stamp the kernel does not have: no TMA stores)
        rel = st - np.nanmin(st[:, 0])
        med = np.nanmedian(np.diff(st, axis=1), axis=0)
        print(f"{M} x {N} x {K}: grid {grid}, kernels (us) " +
              ", ".join(f"{_short(k)} {v:.1f}" for k, v in dur.items()))
        print("   block medians (us): " + ", ".join(
            f"{STAMPS[i]} -> {STAMPS[i + 1]} {med[i] / 1e3:.2f}" for i in range(len(STAMPS) - 1)))
        side = slots[-16 * grid:].reshape(grid, 16)[:, 6:11].astype(np.float64)
        side[side == 0] = np.nan
        side = np.nanmedian(side - st[:, 1:2], axis=0)  # after the prologue's end
        print("   after the prologue (us): " + ", ".join(
            f"{w} {v / 1e3:.2f}" for w, v in zip(SIDE, side)))
        print(f"   starts spread {np.ptp(st[:, 0]) / 1e3:.2f} us; first start -> last end "
              f"{(np.nanmax(st[:, -1]) - np.nanmin(st[:, 0])) / 1e3:.2f} us; block 0 "
              + " ".join(f"{v / 1e3:.2f}" for v in rel[0]), flush=True)


def _short(name):
    for word in ("wgmma_gemm", "splitk_sum"):
        if word in name:
            return word
    return name[:30]


if __name__ == "__main__":
    main()
