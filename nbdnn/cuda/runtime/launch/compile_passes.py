"""Two of numba's compiler steps, rewritten to run in linear time on long kernels.

numba-cuda types, rewrites and lowers a kernel in Python; two of its steps scan the
whole function once per variable, which generated kernels with long unrolled bodies
pay as a product (the bf16 flash-attention forward at D 128: 6,561 statements in 78
blocks, 199 variables assigned more than once):

- SSA reconstruction (numba/cuda/core/ssa.py, Choi et al.'s algorithm) fixes one
  multiply-assigned variable at a time, and for each rewrites every statement of
  every block twice (fresh names for its assignments, then each use tied to its
  reaching definition) with a logging call per statement: 2.6 million statement
  visits there. `run_ssa` applies numba's own handlers to the blocks that name the
  variable (found once: a rewrite renames only its own variable, so the others stay
  where they were); a block that neither assigns nor reads it would be copied
  unchanged, and the fresh names and phi nodes come in the same order.
- The lowering's scan for variables assigned once in one block
  (Lower._find_singly_assigned_variable: they stay in registers, no alloca) counts a
  block's assignments to each such variable by walking the block's statements anew
  for each: 3.5 million statement visits there. `find_singly_assigned_variable`
  counts each block once.

Both give numba's result exactly: tests/test_compile_passes.py compares the IR, and
the PTX of one kernel of each of 104 families came out the same from both (after
numba's per-process name counters). The bf16 flash-attention and GEMM kernels (19, one
process each way, a 2-core host) compile in 99 s against numba's 117. Each is put in
place only over the numba function whose source it was written against (its sha256
in NUMBA_SOURCES); another numba-cuda keeps its own. NBDNN_NUMBA_PASSES=numba keeps
numba's everywhere (docs/environment.md)."""
import collections
import hashlib
import inspect

try:
    from numba.cuda import lowering
    from numba.cuda.core import ir, ssa
except ImportError:  # (another numba-cuda layout: its own passes run)
    lowering = ir = ssa = None


def _rewrite(blocks, labels, states, handler):
    """numba's _run_block_rewrite over the blocks in labels (in block order), without
    its per-statement logging; the other blocks are kept as they are."""
    new = dict(blocks)
    for label, blk in blocks.items():
        if label not in labels:
            continue
        states["label"], states["block"] = label, blk
        body = []
        for stmt in blk.body:
            body.append(handler.on_assign(states, stmt) if isinstance(stmt, ir.assign_types)
                         else handler.on_other(states, stmt))
        out = ir.Block(scope=blk.scope, loc=blk.loc)
        out.body = body
        new[label] = out
    return new


def run_ssa(blocks):
    """numba's ssa._run_ssa(blocks), each violator's two rewrites over the blocks that
    name it."""
    if not blocks:
        return {}
    cfg = ssa.compute_cfg_from_blocks(blocks)
    df_plus = ssa._iterated_domfronts(cfg)
    violators = ssa._find_defs_violators(blocks, cfg)
    cache_list_vars = ssa._CacheListVars()
    where = collections.defaultdict(set)  # variable name -> labels of the blocks naming it
    for label, blk in blocks.items():
        for stmt in blk.body:
            for var in stmt.list_vars():
                where[var.name].add(label)
    for varname in violators:
        labels = where[varname]
        states = ssa._make_states(blocks)
        states.update(varname=varname, defmap=collections.defaultdict(list))
        blocks = _rewrite(blocks, labels, states, ssa._FreshVarHandler())
        defmap = states["defmap"]
        states = ssa._make_states(blocks)
        states.update(varname=varname, defmap=defmap, phimap=collections.defaultdict(list),
                      cfg=cfg, phi_locations=ssa._compute_phi_locations(df_plus, defmap))
        blocks = _rewrite(blocks, labels, states, ssa._FixSSAVars(cache_list_vars))
        for label, philist in states["phimap"].items():
            if philist:  # (a new block: the one there may be the caller's, unrewritten)
                old = blocks[label]
                blk = ir.Block(scope=old.scope, loc=old.loc)
                blk.body = philist + old.body
                blocks[label] = blk
    if ssa.compute_cfg_from_blocks(blocks) != cfg:
        raise ssa.errors.CompilerError("CFG mutated in SSA pass")
    return blocks


def find_singly_assigned_variable(self):
    """numba's Lower._find_singly_assigned_variable, each block's assignments counted
    once."""
    sav = set()
    if not self.func_ir.func_id.is_generator:
        blocks = self.func_ir.blocks
        use_defs = lowering.compute_use_defs(blocks)
        alloca_vars = lowering.must_use_alloca(blocks)
        assigned_in = collections.defaultdict(set)
        for blk, names in use_defs.defmap.items():
            for var in names:
                assigned_in[var].add(blk)
        used = {var for names in use_defs.usemap.values() for var in names}
        counts = {}  # block label -> Counter of its assignment targets
        for var, where in assigned_in.items():
            if var in alloca_vars or len(where) != 1 or var in used:
                continue
            [label] = where
            c = counts.get(label)
            if c is None:
                c = counts[label] = collections.Counter(
                    stmt.target.name for stmt in self.blocks[label].body
                    if isinstance(stmt, ir.assign_types))
            if c[var] == 1:
                sav.add(var)
    self._singly_assigned_vars = sav
    self._blk_local_varmap = {}


def _sha(fn):
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]


# what each replacement was written against: numba-cuda 0.30's functions' sources (the
# ones run_ssa stands in for and the ones _rewrite repeats, the lowering's scan)
NUMBA_SOURCES = {
    "ssa._run_ssa": "aa09fda773d906df", "ssa._fix_ssa_vars": "d4d0d649d9bdf4c3",
    "ssa._fresh_vars": "ffe311064a72b11f", "ssa._run_block_rewrite": "66a25c0bc90d6ed1",
    "ssa._run_ssa_block_pass": "3b7500b76333165d",
    "lowering.Lower._find_singly_assigned_variable": "c3b499f765172885"}


def _numbas(path):
    """numba's function at path ("ssa._run_ssa") if its source is the one written
    against, else None."""
    obj = {"ssa": ssa, "lowering": lowering}.get(path.split(".")[0])
    try:
        for part in path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj if _sha(obj) == NUMBA_SOURCES[path] else None
    except (AttributeError, OSError, TypeError):
        return None


NUMBAS = {path: _numbas(path) for path in NUMBA_SOURCES} if ssa is not None else {}
SSA_OK = all(NUMBAS.get(p) for p in NUMBA_SOURCES if p.startswith("ssa."))
LOWERING_OK = NUMBAS.get("lowering.Lower._find_singly_assigned_variable") is not None


def install():
    """Put both in numba's place where its sources are the ones written against
    (idempotent); returns the names replaced."""
    done = []
    if SSA_OK:
        ssa._run_ssa = run_ssa
        done.append("ssa._run_ssa")
    if LOWERING_OK:
        lowering.Lower._find_singly_assigned_variable = find_singly_assigned_variable
        done.append("lowering.Lower._find_singly_assigned_variable")
    return done
