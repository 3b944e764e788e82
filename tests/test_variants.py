"""The declared kernel variants (nbdnn/cuda/runtime/variants.py and each family's
tables): names unique within a table and documented, every family's forced() refusing
a name it does not declare, a forced variant that cannot take a call refused with the
op's name, chosen() naming what ran, and the choice itself in order of preference."""
import numpy as np
import pytest

import nbdnn
from nbdnn.cuda import attention, batch_norm, conv, matmul, norm, pool, softmax
from nbdnn.cuda.conv import depthwise, gemm as conv_gemm
from nbdnn.cuda.runtime import variants
from nbdnn.cuda.runtime.variants import Variant
from nbdnn.errors import NotSupportedError

TABLES = {"conv": (conv.FORWARD, conv.DATA, conv.FILTER, conv_gemm.COLUMNS, conv_gemm.COL2IM,
                   depthwise.FORWARD),
          "matmul": (matmul.GEMM,), "norm": (norm.FORWARD, norm.BACKWARD),
          "batch_norm": (batch_norm.APPLY, batch_norm.PARTIALS, batch_norm.DX),
          "pool": (pool.FORWARD, pool.BACKWARD),
          "attention": (attention.FORWARD, attention.BACKWARD)}
FAMILIES = {"conv": conv, "matmul": matmul, "norm": norm, "batch_norm": batch_norm,
            "pool": pool, "attention": attention, "softmax": softmax}


@pytest.mark.parametrize("family", sorted(TABLES))
def test_tables_name_each_variant_once_with_a_doc(family):
    for table in TABLES[family]:
        names = [v.name for v in table]
        assert len(names) == len(set(names)), names
        assert all(isinstance(v, Variant) and v.doc for v in table)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_forced_refuses_an_undeclared_name(family):
    with pytest.raises(ValueError, match="no .* variant 'nonesuch'"):
        with FAMILIES[family].forced("nonesuch"):
            pass


def test_choose_order_wanted_forced_and_chosen():
    ran = []
    table = (Variant("a", lambda c: c > 0, lambda c: ran.append("a"), "a",
                     wanted=lambda c: c > 5),
             Variant("b", lambda c: c > 1, lambda c: ran.append("b"), "b"),
             Variant("c", lambda c: True, lambda c: ran.append("c"), "c"))
    with variants.chosen() as got:
        for call in (0, 3, 9):
            variants.choose("demo", "demo_op", table, call).run(call)
        with variants.forced("demo", "a", variants.names(table)):
            variants.choose("demo", "demo_op", table, 3).run(3)  # usable, not wanted: runs
            with pytest.raises(NotSupportedError, match="demo_op: variant 'a' \\(forced\\)"):
                variants.choose("demo", "demo_op", table, 0)
        with variants.forced("other", "a", {"a"}):  # another family's: no effect here
            variants.choose("demo", "demo_op", table, 0).run(0)
    assert ran == ["c", "b", "a", "a", "c"]
    assert got == [("demo", n) for n in ("c", "b", "a", "a", "c")]


def test_a_forced_variant_runs_the_call_and_refuses_what_it_cannot_take():
    """conv's forward: "direct" forced runs where "auto" picks winograd (the reference's
    numbers); "winograd" forced on a 1x1 filter is refused."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 4, 6, 6)), rng.standard_normal((4, 4, 3, 3))
    want = nbdnn.conv2d(x, w, padding=1, backend="cpu")
    with conv.forced("direct"), variants.chosen() as got:
        y = nbdnn.conv2d(x, w, padding=1, backend="cuda")
    assert got == [("conv", "direct")]
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-12, atol=1e-12)
    with conv.forced("winograd"), pytest.raises(NotSupportedError, match="conv_forward"):
        nbdnn.conv2d(x, w[:, :, :1, :1], backend="cuda")
