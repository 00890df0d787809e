

def test_gpt2_on_a_mesh_exits_2(tmp_path: Any) -> None:
    """Not built for a device mesh yet: a config error naming the kind."""
    r = subprocess.run([STRATA, "plan", "configs/test.yml", "model.block=gpt2", "parallel.data=2", "train.microbatches=1",
                        "runtime.cpu_devices=2", f"runtime.cache_dir={tmp_path}"], cwd=ROOT, capture_output=True,
                       text=True, env=ENV)
    assert r.returncode == 2, r.stderr
    assert "'gpt2'" in r.stderr and "model.block/model.layers" in r.stderr, r.stderr
