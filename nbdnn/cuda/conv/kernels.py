"""The table of every convolution kernel built at import: (name, dtype) -> (Kernel,
signature), for the direct, gemm (im2col/col2im and epilogues), winograd, implicit GEMM
(variants 2 and 3 at each GEMM tile) and generated depthwise kernels. The depthwise row
kernels are built per window geometry on first use (depthwise_rows.py)."""

from ..matmul import TILES
from ..matmul.gemm_source import gemm_about
from ..runtime.launch.codegen import compile_source
from ..runtime.launch.kernel import Kernel
from ..runtime.simulator import SIMULATOR
from ..runtime.device_code.intrinsics import array_type
from ..._vocab import BF16_DTYPES
from . import depthwise, direct, gemm, winograd
from .implicit_gemm_source import igemm_chunked_source, igemm_source
from .source_names import COMPUTE, namespace

GEOM = ", ".join(["int64"] * 24)  # the 24 ints of a conv geometry, as kernel parameters
IGEMM_WHY = {"igemm_": "variant 2: any C/g (taps gathered through a table per reduction index)",
             "igemm_chunked_": "variant 3: C/g >= BK, channels last (a k-step one tap, "
                               "contiguous channels)",
             "igemm_chunked_t_": "variant 3 transposed: channels first (tile rows are "
                                 "positions, so loads run along the map)"}


def _build():
    table = {}
    for ct_name, (CT, nt) in COMPUTE.items():
        base = namespace(ct_name)
        act_fn = base["act_fn"]
        kernels = direct.kernels(CT, act_fn)
        kernels.update(gemm.kernels(CT, act_fn))
        kernels.update(winograd.kernels(CT, base["epilogue"]))
        ins = dict(base)
        for size, cfg in TILES[ct_name].items():
            for variant, (name, src) in (("igemm_", igemm_source(*cfg)),
                                         ("igemm_chunked_", igemm_chunked_source(*cfg, False)),
                                         ("igemm_chunked_t_", igemm_chunked_source(*cfg, True))):
                if variant == "igemm_" and size == "large":
                    continue  # (variant 2 skips C/g < BK: a reduction too short for it)
                kernels[variant + size] = compile_source(name, src, ins, label=f"{name}_{ct_name}",
                                                         about=gemm_about(
                    ct_name, size, cfg, f"implicit GEMM convolution, {IGEMM_WHY[variant]}"))
        ins = dict(base)
        for name, src in depthwise.sources().items():
            kernels[name] = compile_source(name, src, ins, label=f"{name}_{ct_name}", about={
                "what": f"depthwise convolution, {ct_name} compute (depthwise.py's variants)"})
        for t in (d for d in BF16_DTYPES if (d == "float64") == (ct_name == "float64")):
            a = f"{array_type(t)}[::1]"  # (bfloat16: its bits)
            sigs = {"fwd": f"void({a}, {a}, {a}, {a}, {a}, {GEOM}, int64, int64, int64, "
                           f"{ct_name}, {ct_name}, {ct_name})",
                    "bwd_data": f"void({a}, {a}, {a}, {GEOM}, {ct_name}, {ct_name})",
                    "bwd_filter": f"void({a}, {a}, {a}, {GEOM}, {ct_name}, {ct_name})"}
            igemm = sigs["fwd"].replace(f"{a}, {GEOM}", f"{a}, int64[::1], {GEOM}", 1)[:-1] \
                + ", int64)"
            sigs.update({v + size: igemm for size in TILES[ct_name]
                         for v in ("igemm_", "igemm_chunked_", "igemm_chunked_t_")
                         if v + size in kernels})
            sigs.update(gemm.signatures(t, ct_name, GEOM))
            sigs.update(winograd.signatures(t, ct_name))
            sigs.update(depthwise.signatures(t, ct_name, GEOM))
            for name, sig in sigs.items():
                # the 128x128 tile at 128 registers runs two blocks an SM (as the GEMM)
                cap = {"max_registers": 128} if name.startswith("igemm_chunked") and \
                    name.endswith("_large") and ct_name == "float32" and not SIMULATOR else {}
                table[name, t] = (Kernel(kernels[name], [sig], **cap), sig)
    return table


KERNELS = _build()
