"""Thread-block clusters (sm_90): blocks of one cluster run at once on one GPC, can
read and write each other's shared memory (distributed shared memory) and wait at a
cluster-wide barrier; TMA can multicast one load to several of them.

Launching a cluster needs no new launch path: cluster_dims(x, y, z) in a kernel's body
fixes its cluster shape at compile time (NVVM's cluster_dim_x/y/z annotations; the
PTX entry gets `.explicitcluster` and `.reqnctapercluster x, y, z`), and the driver's
plain cuLaunchKernel (runtime/launch/kernel.py, graphs, plans) then launches clusters; the
grid must be a multiple of the shape. (numba-cuda 0.30's launch_bounds reach only
cluster_max_blocks; cuLaunchKernelEx's cluster attribute would need a second launch
record.)

A block's shared-memory address (a .shared::cta u32, as smem_address gives) becomes the
same variable in cluster block `rank` with mapa; ld/st .shared::cluster then reach it.
A block must not exit while another may still read its shared memory: a last cluster
barrier before the end.
"""
from llvmlite import ir
from numba import types
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

from .asm import F32, I32, inline_asm, statement, values

u32 = types.uint32
_RANK = "mov.u32 $0, %cluster_ctarank;"
_MAPA = "mapa.shared::cluster.u32 $0, $1, $2;"
_LD_F32 = "ld.shared::cluster.f32 $0, [$1];"
_LD_V4_F32 = "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [$4];"
_ARRIVE = "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [$0];"
_TRY_WAIT = ("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 "
             "p, [$1], $2;\nselp.u32 $0, 1, 0, p;\n}")


@intrinsic
def cluster_dims(typingctx, x, y, z):
    """Fix the calling kernel's cluster shape to (x, y, z) blocks (integer literals; at
    most 8 blocks a cluster portably). Call it once in the kernel's own body (not in a
    device function): it annotates the function it is compiled into. Emits no code;
    the PTX entry gets `.explicitcluster` and `.reqnctapercluster x, y, z`."""
    if not all(isinstance(t, types.IntegerLiteral) for t in (x, y, z)):
        return None
    dims = tuple(t.literal_value for t in (x, y, z))

    def codegen(context, builder, sig, args):
        module = builder.module
        nmd = cgutils.get_or_insert_named_metadata(module, "nvvm.annotations")
        for prop, v in zip(("cluster_dim_x", "cluster_dim_y", "cluster_dim_z"), dims):
            nmd.add(module.add_metadata((builder.function, ir.MetaDataString(module, prop),
                                         ir.Constant(ir.IntType(32), v))))
        return context.get_dummy_value()
    return types.void(x, y, z), codegen


@intrinsic
def cluster_ctarank(typingctx):
    """This block's rank in its cluster (0 .. blocks a cluster - 1)."""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, I32, [], _RANK, "=r")
    return u32(), codegen


@intrinsic
def mapa_shared(typingctx, addr, rank):
    """The .shared::cluster address of .shared::cta address `addr` in cluster block
    `rank` (the same variable in that block's shared memory)."""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, I32, list(args), _MAPA, "=r,r,r")
    return u32(u32, u32), codegen


@intrinsic
def ld_shared_cluster_f32(typingctx, addr):
    """Load a float32 from .shared::cluster address `addr` (mapa_shared's result)."""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, F32, list(args), _LD_F32, "=f,r,~{memory}")
    return types.float32(u32), codegen


@intrinsic
def ld_shared_cluster_v4_f32(typingctx, addr):
    """Load four float32 (16 bytes, 16-byte aligned) from .shared::cluster `addr`."""
    def codegen(context, builder, sig, args):
        struct = inline_asm(builder, ir.LiteralStructType([F32] * 4), list(args), _LD_V4_F32,
                            "=f,=f,=f,=f,r,~{memory}")
        return values(context, builder, sig, struct, 4)
    return types.UniTuple(types.float32, 4)(u32), codegen


@intrinsic
def mbarrier_arrive_cluster(typingctx, addr):
    """Arrive once on the mbarrier at .shared::cluster `addr` (mapa_shared's: any
    block's of the cluster, this one's too), releasing this thread's earlier writes -
    and, after a block barrier, its block's - to the cluster."""
    def codegen(context, builder, sig, args):
        inline_asm(builder, ir.VoidType(), list(args), _ARRIVE, "r,~{memory}")
    return types.void(u32), codegen


@intrinsic
def mbarrier_try_wait_parity_cluster(typingctx, bar, parity):
    """1 once the phase of this parity of this block's mbarrier at .shared `bar` has
    completed, acquiring what the arriving threads of the cluster released; else 0."""
    def codegen(context, builder, sig, args):
        return inline_asm(builder, I32, list(args), _TRY_WAIT, "=r,r,r,~{memory}")
    return u32(u32, u32), codegen


barrier_cluster_arrive = statement(
    "barrier.cluster.arrive.release.aligned;",
    "Arrive at the cluster barrier, releasing this thread's earlier shared-memory "
    "writes to the cluster (every thread of every block of the cluster arrives).")
barrier_cluster_wait = statement(
    "barrier.cluster.wait.acquire.aligned;",
    "Wait until every thread of the cluster has arrived; their released writes are "
    "visible after it.")

fence_mbarrier_init_cluster = statement(
    "fence.mbarrier_init.release.cluster;",
    "Release this thread's mbarrier initialisations to the cluster (before the cluster "
    "barrier that lets other blocks arrive on them).")

for _f, _t in ((cluster_ctarank, _RANK), (mapa_shared, _MAPA), (ld_shared_cluster_f32, _LD_F32),
               (ld_shared_cluster_v4_f32, _LD_V4_F32), (mbarrier_arrive_cluster, _ARRIVE),
               (mbarrier_try_wait_parity_cluster, _TRY_WAIT)):
    _f.__doc__ += f"\n\nPTX: `{_t}`"
