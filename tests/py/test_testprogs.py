"""The runtime's test-program exporter writes a complete, parsable index."""

import os

import numpy as np

from strata_jax import testprogs


def test_export_all_writes_index_and_files(tmp_path):
    lines = testprogs.export_all(str(tmp_path))
    progs = [l.split() for l in lines if l.startswith("program ")]
    names = {p[1] for p in progs}
    assert {"elementwise", "matmul", "reduction", "multi_out", "donate", "while_loop", "bf16", "ints",
            "elementwise_bc", "bigreduce"} <= names
    kinds = {p[1]: p[3] for p in progs}
    assert kinds["elementwise_bc"] == "bytecode" and kinds["matmul"] == "text"
    donate = (tmp_path / "donate.mlir").read_text()
    assert "tf.aliasing_output" in donate or "jax.buffer_donor" in donate
    assert "stablehlo.while" in (tmp_path / "while_loop.mlir").read_text()
    sizes = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "pred": 1}
    for line in lines:
        f = line.split()
        if f[0] not in ("in", "out"):
            continue
        dims = [] if f[4] == "-" else [int(d) for d in f[4].split(",")]
        path = tmp_path / f[5]
        assert os.path.getsize(path) == int(np.prod(dims, dtype=np.int64)) * sizes[f[3]], line
    index = (tmp_path / "index.txt").read_text().splitlines()
    assert index == lines
