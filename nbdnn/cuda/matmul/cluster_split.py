"""Split-K reduced inside a thread-block cluster (wgmma_gemm.CLUSTER_SPLIT): the chunks
of one output tile run on the S blocks of one cluster, which add their float32 sums
through distributed shared memory and store C with the full epilogue. No workspace
and no second kernel, where the workspace path (split_k.py) writes S float32 copies of
the tile to global memory and splitk_sum reads them back (3.3-10 us of a
skinny call's 24-58).

    cluster of S = 4 blocks, one 64 x 256 tile, K in 4 chunks
    block (rank) r:  k-loop over chunk r -> accumulators d (64 x 256 float32 over the
                     two consumer warpgroups) -> its own R (shared memory, 64 KB)
                     -> every block's R ready (mbarrier `ready`, S arrivals)
                     -> slice r of the tile: R of rank 0 + R of rank 1 + ... (that
                        order on every run: deterministic), bias, activation, alpha,
                        beta -> C
                     -> every block done reading (mbarrier `free`) before R is rewritten

R holds the accumulators in fragment order, 16 bytes (d[4j .. 4j + 3]) a thread and
group j: entry e = (w G + j) 128 + i for consumer warpgroup w, thread i of it, group j
of G = nw / 8 (nw: a consumer's columns). A warp's st.shared.v4 and a slice's
ld.shared::cluster.v4 move 512 contiguous bytes: no bank conflicts, no padding. Entry e
is C's rows r, r + 8 and columns c, c + 1 of wgmma's D fragment (wgmma_stage.place_lines
with i = e % 128, j = (e // 128) % G, w = e // (128 G)); rank r reduces entries
[r E / S, (r + 1) E / S), E = 2 G 128, its 256 consumer threads one entry each a step.

Traffic a tile (64 x 256, S blocks): each block writes its 64 KB to its own R and reads
64 / S KB from each of the S Rs (64 KB over the cluster's network), and writes its
slice of C once (2 or 4 B an element); the workspace path writes and reads S x 64 KB
through L2 and launches a second kernel.

Synchronisation, per tile u of a block (its parity u & 1):
    wait free[u - 1]             (the peers have read this block's previous R)
    st.shared.v4 d -> R          (consumer threads)
    bar.sync 3, 256              (both consumer warpgroups' stores done)
    thread 128: arrive.release.cluster on ready of every rank (mapa)
    wait ready[u] (acquire.cluster): every block's R holds tile u
    reduce the slice, epilogue, store C
    bar.sync 3, 256; thread 128: arrive.release.cluster on free of every rank
and after the last tile each block waits on its free once more, so none exits while a
peer may still read its R. The barriers are initialised before a cluster-wide barrier
(fence.mbarrier_init), so no remote arrive reaches an uninitialised one.

The cluster shape is fixed at compile time (cluster.cluster_dims: `_c{S}` in the
kernel's name, S a literal in its source); a cluster's blocks are consecutive
blockIdx.x, rank = blockIdx.x % S, and cluster q of the grid's G_c takes output tiles
q, q + G_c, ... with chunk = rank.
Used for the 64-row tile (R = 64 KB beside 4 stages of 40 KB) and 2-8 chunks.
"""

REDUCE_BAR = 3          # named barrier of the two consumer warpgroups (staged_store: 1, 2)
MAX_CLUSTER = 8         # blocks a cluster, portably


def reduce_bytes(nw):
    """R's bytes: the two consumer warpgroups' nw / 2 accumulators a thread, float32."""
    return 2 * nw // 2 * 128 * 4


def barrier_lines(indent, S):
    """Thread 0 (beside the pipeline's barriers): ready and free, S arrivals a phase
    each, their initialisation released to the cluster."""
    return [f"{indent}mbarrier_init(U32(ready0), {S})",
            f"{indent}mbarrier_init(U32(ready0 + 8), {S})",
            f"{indent}fence_mbarrier_init_cluster()"]


def setup_lines(S):
    """The kernel's first line (the cluster shape) and, for every thread after the
    block's barrier, the cluster's barrier: every block's ready and free initialised."""
    return [f"    cluster_dims({S}, 1, 1)"], ["    barrier_cluster_arrive()",
                                                 "    barrier_cluster_wait()"]


def loop_lines(indent, S):
    """The tile loop's head: cluster q's output tiles, this block's chunk (its rank)."""
    return [f"{indent}for u in range(cuda.blockIdx.x // {S}, total, cuda.gridDim.x // {S}):",
            f"{indent}    t = (cuda.blockIdx.x % {S}) * total + u"]


def _wait(indent, bar, parity):
    return [f"{indent}while mbarrier_try_wait_parity_cluster(U32({bar}), U32({parity})) == 0:",
            f"{indent}    pass"]


def _arrive_all(bar, S):
    return ["if tid == 128:", f"    for p in range({S}):",
            f"        mbarrier_arrive_cluster(mapa_shared(U32({bar}), U32(p)))"]


def tile_lines(S, nw, bm, bn, pair_lines):
    """A consumer's end of tile ut (after its k-loop): accumulators to R, the cluster's
    sum of its slice, the epilogue through pair_lines(col, rows) (pair_epilogue.py with
    this kernel's epilogue bound), C stored. Names: d, i, w, tid, m0, n0, zk, nz, M, N,
    rbase, ready0 (ready; free at + 8), ut (this block's tiles so far)."""
    G = nw // 8
    E = 2 * G * 128
    L = ["if ut > 0:"] + _wait("    ", "ready0 + 8", "(ut - 1) & 1")
    for j in range(G):
        L += [f"st_shared_v4_f32(U32(rbase + (w * {G * 128} + {128 * j} + i) * 16), "
              f"d[{4 * j}], d[{4 * j + 1}], d[{4 * j + 2}], d[{4 * j + 3}])"]
    L += [f"bar_sync(U32({REDUCE_BAR}), U32(256))"] + _arrive_all("ready0", S) + \
        _wait("", "ready0", "ut & 1") + [
        "coff = (zk % nz) * M * N",
        f"rank = cuda.blockIdx.x % {S}",
        f"for e in range(rank * {E} // {S} + tid - 128, (rank + 1) * {E} // {S}, 256):",
        "    ra = U32(rbase + e * 16)",
        "    s0, s1, s2, s3 = ld_shared_cluster_v4_f32(mapa_shared(ra, U32(0)))",
        f"    for p in range(1, {S}):  # (rank order: the same sum on every run)",
        "        t0, t1, t2, t3 = ld_shared_cluster_v4_f32(mapa_shared(ra, U32(p)))",
        "        s0 += t0", "        s1 += t1", "        s2 += t2", "        s3 += t3",
        "    ie = e % 128",
        f"    je = (e // 128) % {G}",
        f"    we = e // {128 * G}",
        "    r = " + ("m0 + we * 64" if bm == 128 else "m0") +
        " + 16 * (ie // 32) + (ie % 32) // 4",
        "    cb = n0 + " + (f"we * {bn // 2} + " if bm != 128 else "") + "2 * (ie % 4) + 8 * je"]
    L += ["    " + x for x in pair_lines("cb", [("r", "s0", "s1"), ("(r + 8)", "s2", "s3")])]
    return L + [f"bar_sync(U32({REDUCE_BAR}), U32(256))"] + _arrive_all("ready0 + 8", S) + \
        ["ut += 1"]


def final_lines(indent):
    """After a consumer's last tile: the peers are done reading this block's R."""
    return [f"{indent}if ut > 0:"] + _wait(indent + "    ", "ready0 + 8", "(ut - 1) & 1")
