"""bench/: the pieces of `make bench` and bench/gpu.sh that do not need a
quiet machine or a GPU (parsing, statistics, FLOPs, the report), and the
GPU script's plumbing in its CPU dry run. No timing is asserted anywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import flops as FL  # noqa: E402
import gpu_report as G  # noqa: E402
import perfsplit as P  # noqa: E402
import run as R  # noqa: E402


def test_step_summary_reads_fields_defensively() -> None:
    metrics = [{"step": i + 1, "loss": 1.0, "step_time_s": t, "wait_s": t - 0.01, "peak_live_bytes": 100 + i,
                "launches": 24} for i, t in enumerate([0.9, 0.5, 0.2, 0.3, 0.1])]
    metrics.append({"step": 5, "eval_loss": 2.0})  # eval line: no step time, must be ignored
    s = R.strata_step_summary(metrics, warmup=2)
    assert s["n"] == 3 and s["median_s"] == pytest.approx(0.2) and s["min_s"] == 0.1 and s["max_s"] == 0.3
    assert s["host_s_median"] == pytest.approx(0.01)
    assert s["host_fraction"] == pytest.approx(0.01 / 0.2)
    assert s["peak_live_bytes"] == 104 and s["launches_per_step"] == 24
    # A build without wait_s / peak_live_bytes (or with them renamed): no
    # host share, no peak, but the step times still count.
    bare = [{"step": 1, "step_time_s": 0.4}, {"step": 2, "step_time_s": 0.2, "wait_s": None}]
    s = R.strata_step_summary(bare, warmup=0)
    assert s["median_s"] == pytest.approx(0.3) and "host_fraction" not in s and s["peak_live_bytes"] is None
    assert R.strata_step_summary([], warmup=3)["median_s"] is None


def test_read_jsonl_skips_a_cut_line(tmp_path: Any) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "step_time_s": 0.5}\n\n{"step": 2, "step_ti')
    assert R.read_jsonl(str(p)) == [{"step": 1, "step_time_s": 0.5}]
    assert R.read_jsonl(str(tmp_path / "missing.jsonl")) == []


def test_targets_and_ratios() -> None:
    assert R.ratio(3.0, 2.0) == 1.5 and R.ratio(1.0, None) is None and R.ratio(None, 1.0) is None
    assert R.ratio(1.0, 0) is None
    assert R.target_line("x", 1.2, 1.1, "le")["met"] is False
    assert R.target_line("x", 6.0, 5.0, "ge")["met"] is True
    assert R.target_line("x", None, 5.0, "ge")["met"] is None
    res = {"compile": {"depths": {
        "2": {"strata_cold": {"startup_s": 4.0}, "strata_warm": {"startup_s": 0.2}, "unroll": {"lower_plus_compile_s": 3.0}},
        "32": {"strata_cold": {"startup_s": 5.0}, "strata_warm": {"startup_s": 0.4}, "unroll": {"lower_plus_compile_s": 30.0}}}},
        "overhead": {"preset": "small", "metrics": {"host_fraction": 0.01}, "strata": None}}
    t = {x["target"]: x for x in R.targets(res)}
    assert t["strata cold start 32 vs 2 layers"]["value"] == pytest.approx(1.25)
    assert t["strata cold start 32 vs 2 layers"]["met"] is False
    assert t["unroll lower+compile / strata cold start at 32 layers"]["value"] == pytest.approx(6.0)
    assert t["strata warm start (slowest depth)"]["value"] == pytest.approx(0.4)
    assert t["framework overhead (small)"]["value"] == pytest.approx(0.01)  # metrics fallback without perf


def test_perf_script_parsing_and_split() -> None:
    text = "\n".join([
        " 100/100  10.000000:  55d1 st_executor_run (/repo/build/strata)",
        " 100/100  10.001000:  7f01 [unknown] (/x/pjrt_c_api_cpu_plugin.so)",
        " 100/101  10.002000:  ffffffff8164 clear_page_erms ([kernel.kallsyms])",
        " 100/101  10.003000:  7f02 [unknown] (/x/pjrt_c_api_cpu_plugin.so)",
        " 100/102  10.004000: ",                           # no symbol / object
        " 100/101  99.000000:  7f02 [unknown] (/x/pjrt_c_api_cpu_plugin.so)",  # outside the window
        " 200/200  10.002000:  7f02 main (/usr/bin/other)",  # another process
        "garbage line",
    ])
    rows = P.parse_script(text)
    assert len(rows) == 7 and rows[0] == (100, 100, 10.0, "st_executor_run", "/repo/build/strata")
    assert rows[4][3:] == ("", "")
    sp = P.split(rows, 100, 9.5, 10.5)
    assert sp["main_cpu_s"] == pytest.approx(0.002)
    assert sp["main_by_object_s"] == {"strata": 0.001, "pjrt_c_api_cpu_plugin.so": 0.001}
    assert sp["worker_cpu_s"] == pytest.approx(0.003)
    assert sp["worker_by_object_s"]["kernel"] == pytest.approx(0.001)
    assert sp["window_s"] == pytest.approx(1.0)


def test_model_flops() -> None:
    m = {"d_model": 256, "d_ff": 1024, "seq_len": 256, "vocab_size": 256, "n_layers": 8}
    per_layer = 2 * (4 * 256 * 256 + 3 * 256 * 1024) + 4 * 256 * 256
    assert FL.forward_flops_per_token(m) == 8 * per_layer + 2 * 256 * 256
    cfg = {"model": m, "train": {"batch_size": 8}}
    assert FL.step_flops(cfg) == 3 * 8 * 256 * FL.forward_flops_per_token(m)
    # gpt2: two MLP matrices; grouped-query attention: k and v at n_kv_heads
    g = {**m, "block": "gpt2", "n_heads": 8, "n_kv_heads": 2}
    per_layer = 2 * (2 * 256 * 256 + 2 * 256 * 64 + 2 * 256 * 1024) + 4 * 256 * 256
    assert FL.forward_flops_per_token(g) == 8 * per_layer + 2 * 256 * 256
    mix = {**m, "layers": ["llama", "gpt2"] * 4}
    assert FL.forward_flops_per_token(mix) == FL.forward_flops_per_token(m) - 4 * 2 * 256 * 1024


def test_markdown_report_renders_every_section() -> None:
    run = {"median_s": 0.2, "maxrss_bytes": 2**28, "other_load": 0.1, "peak_live_bytes": 2**20,
           "xla_peak_bytes_estimate": 2**21, "round": 0}
    best = {"median_s": 0.2, "all_medians_s": [0.2], "maxrss_bytes": 2**28, "cpu_s_per_step": 0.3,
            "minor_faults_per_step": 10.0}
    res = {
        "quick": False, "seconds": 10.0,
        "environment": {"date": "d", "host": "h", "cpus": 2, "cpu": "c", "git_commit": "abc", "git_dirty": False,
                        "jax": "0.11.2", "loadavg_start": (0.1, 0.2, 0.3), "doctor_matmul_gflops": 90.0},
        "step": {"rounds": 1, "presets": {"tiny": {
            "steps": 25, "warmup": 5, "diag_steps": 13, "retries": 0, "model_flops_per_step": 10**9,
            "tokens_per_step": 256, "diagnostic": ["unroll malloc"],
            "runs": {"strata": [run], "unroll": [run], "unroll malloc": [run]},
            "best": {"strata": best, "unroll": {**best, "median_s": 0.1, "all_medians_s": [0.1], "cpu_s_per_step": 0.6},
                     "unroll malloc": best},
            "ratio": {"unroll": 2.0, "unroll malloc": 1.0}, "cpu_ratio": {"unroll": 0.5, "unroll malloc": 1.0},
            "ratio_per_round": {"unroll": [2.0], "unroll malloc": [1.0]}}}},
        "overhead": {"preset": "tiny", "steps": 8, "warmup": 2, "metrics": {"host_fraction": 0.01,
                     "host_s_median": 0.002, "median_s": 0.2}, "perf_unavailable": "perf is not installed",
                     "programs": {"client": "plugin", "launches_per_step": 3, "sum_per_step_s": 0.15, "programs": [
                         {"program": "block_fwd", "launches_per_step": 3, "median_s": 0.05, "per_step_s": 0.15,
                          "flops": 10**8, "compile_s": 0.2}]}},
    }
    res["targets"] = R.targets(res)
    md = R.markdown(res)
    assert "| tiny (20+5) | unroll | 100 ms | 100 | 2 | 2 | 0.6 | 0.5 | 10 | 10.0 | 2560 | 11.1% |" in md
    assert "(90 GFLOP/s)" in md  # the peak the share is of: strata doctor's matmul
    assert "| tiny (8+5) | *unroll malloc* |" in md  # a diagnostic: its own step count, in italics
    assert "| step time strata/unroll (tiny) | 2 | 1.1 | **no** |" in md
    assert "| framework overhead (tiny) | 0.01 | 0.05 | yes |" in md  # metrics fallback without perf
    assert "perf: not measured (perf is not installed)" in md and "| block_fwd | 3 | 50 ms | 150 ms |" in md


def test_step_window_and_proc_reading(tmp_path: Any) -> None:
    here = R.proc_cpu_and_faults(os.getpid())
    assert here is not None and here[0] > 0 and here[1] > 0
    assert R.proc_cpu_and_faults(2**22 + 12345) is None  # no such process
    metrics = tmp_path / "metrics.jsonl"
    w = R.StepWindow(str(metrics), first=2, last=4)
    w(os.getpid())  # no file yet: nothing
    assert w.start is None
    metrics.write_text('{"step": 1, "step_time_s": 1}\n{"step": 2, "step_time_s": 1}\n')
    w(os.getpid())
    assert w.start is not None and w.end is None
    sum(i * i for i in range(300000))  # burn a little CPU between the snapshots
    metrics.write_text(metrics.read_text() + '{"step": 2, "eval_loss": 1}\n{"step": 3, "step_time_s": 1}\n'
                       '{"step": 4, "step_time_s": 1}\n')
    w(os.getpid())
    per = w.per_step()
    assert per["cpu_s_per_step"] is not None and per["cpu_s_per_step"] >= 0
    assert per["minor_faults_per_step"] is not None and per["minor_faults_per_step"] >= 0
    assert R.StepWindow(str(metrics), 2, 4).per_step() == {"cpu_s_per_step": None, "minor_faults_per_step": None}


def test_gpu_fallback_config_matches_strata() -> None:
    """gpu_report's built-in config (for a GPU machine where strata could not be
    built) must equal what `strata config --json` resolves."""
    strata = os.path.join(ROOT, "build", "strata")
    if not os.access(strata, os.X_OK):
        raise AssertionError(f"{strata} is missing: run `make build` first (make test does)")
    for dry, config, over in ((True, G.DRY_CONFIG, G.DRY_OVERRIDES), (False, G.GPU_CONFIG, G.GPU_OVERRIDES)):
        r = subprocess.run([strata, "config", "--json", config, *over], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        full = json.loads(r.stdout)
        mine = G.fallback_config(dry, over)
        for sect in ("model", "train"):
            for k, v in mine[sect].items():
                assert full[sect][k] == pytest.approx(v), (config, sect, k)
        assert full["seed"] == mine["seed"] and full["data"]["val_fraction"] == mine["data"]["val_fraction"]


def test_gpu_scripts_parse_and_refuse_bad_arguments() -> None:
    """The short version of the two GPU drills below (make test-long): both
    scripts parse, and gpu.sh refuses an unknown argument with exit 2."""
    for name in ("gpu.sh", "gpu_probe.sh"):
        assert subprocess.run(["bash", "-n", os.path.join(ROOT, "bench", name)]).returncode == 0, name
    r = subprocess.run([os.path.join(ROOT, "bench", "gpu.sh"), "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr


@pytest.mark.long
def test_gpu_script_dry_run(tmp_path: Any) -> None:
    """bench/gpu.sh on CPU (configs/test.yml, bf16): every part runs and the
    report has MFU for all three rows, and the parallel section ran on 4 CPU
    devices (data=2, data=4, fsdp=2, tensor=2). Costs ~75-90 s, mostly XLA
    compiles and exports."""
    script = os.path.join(ROOT, "bench", "gpu.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    r = subprocess.run([script, "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr
    out = tmp_path / "gpu"
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_BIN", "STRATA_PYTHON", "OUT")}
    env["STRATA_CACHE_DIR"] = str(tmp_path / "cache")
    # The binary a GPU session carries (`make build-portable`): it needs only
    # glibc there, and runs from another folder.
    portable = os.path.join(ROOT, "build-portable", "strata")
    assert os.access(portable, os.X_OK), "build-portable/strata missing: `make build-portable` (make test builds it)"
    deps = subprocess.run(["ldd", portable], capture_output=True, text=True).stdout
    assert not [d for d in ("libyaml", "libjansson", "libxxhash", "libcrypto", "libprotobuf-c") if d in deps], deps
    carried = tmp_path / "carried" / "strata"
    carried.parent.mkdir()
    shutil.copy2(portable, carried)
    env["STRATA_BIN"] = str(carried)
    r = subprocess.run([script, "--dry-run", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(next(out.glob("gpu-dry-*.json")).read_text())
    assert {k: v["status"] for k, v in res["parts"].items()} == {
        "matmul_peak": "ok", "inputs": "ok", "strata_cold_and_steps": "ok", "strata_warm_start": "ok",
        "anchor_unroll": "ok", "anchor_scan": "ok", "parallel": "ok"}
    assert res["matmul"]["peak_tflops"] > 0 and res["model_flops_per_step"] > 0
    for k in ("strata", "unroll", "scan"):
        assert res[k]["median_s"] > 0, k
    assert res["strata_warm"]["cache_hits"] > 0
    assert "block_bwd_res" in res["strata"]["program_seconds"] and res["strata"]["compile_threads"] >= 1
    assert f"strata: {carried}" in r.stderr, r.stderr
    # the parallel section on the dry run's 4 CPU devices: every mesh, strata and anchor
    par = res["parallel"]
    assert list(par["meshes"]) == ["1", "data=2", "data=4", "fsdp=2", "tensor=2"] and par["devices"] == 4
    assert all(row["anchor"]["median_s"] > 0 and row["strata"]["default"]["median_s"] > 0
               for row in par["meshes"].values())
    md = next(out.glob("gpu-dry-*.md")).read_text()
    assert md.count("| strata |") == 1 and "| unroll |" in md and "| scan |" in md
    assert "### Parallel: meshes on 4 CPU devices" in md and "| data=4 | bucketed |" in md
    assert "| fsdp=2 | reshard_after_forward=false |" in md and "| tensor=2 | default |" in md


@pytest.mark.long
def test_gpu_probe_on_cpu(tmp_path: Any) -> None:
    """bench/gpu_probe.sh with the CPU plugin on a tiny shape: three runs,
    the warm one from the cold one's cache, each with its peak RSS and start-up."""
    script = os.path.join(ROOT, "bench", "gpu_probe.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    plugin = subprocess.run([os.path.join(ROOT, "build", "strata"), "doctor"], cwd=ROOT, capture_output=True,
                            text=True).stdout
    path = next(l.split()[-1] for l in plugin.splitlines() if l.startswith("plugin:"))
    env = {**os.environ, "OUT": str(tmp_path), "STRATA_BIN": os.path.join(ROOT, "build", "strata"),
           "STRATA_PJRT_PLUGIN": path, "STRATA_PYTHON": sys.executable}
    r = subprocess.run([script, "model.d_model=64", "model.n_heads=4", "model.d_ff=128", "model.n_layers=2",
                        "model.seq_len=32", "train.batch_size=2", "model.compute_dtype=f32"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in ("cold-1thread", "warm-1thread", "cold-default")}
    for n, v in res.items():
        assert v["rc"] == 0 and v["maxrss_mib"] > 0 and v["startup_s"] > 0 and len(v["step_times_s"]) == 10, (n, v)
    assert res["cold-1thread"]["cache_hits"] == 0 and res["cold-1thread"]["compile_threads"] == 1
    assert res["warm-1thread"]["cache_hits"] > 0 and res["cold-default"]["cache_hits"] == 0


@pytest.mark.long
def test_quick_compile_section_end_to_end(tmp_path: Any) -> None:
    """`bench/run.py --quick --sections compile` with real processes: every
    depth starts cold, then warm, and a depth after another depth exports
    and compiles nothing (no program depends on n_layers). ~40 s."""
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CACHE_DIR"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--sections", "compile",
                        "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(next(tmp_path.glob("*.json")).read_text())
    depths = res["compile"]["depths"]
    assert sorted(depths, key=int) == ["2", "4"]
    for n, row in depths.items():
        cold, warm = row["strata_cold"], row["strata_warm"]
        assert cold["exported"] and cold["cache_hits"] == 0 and cold["programs_compiled"] >= 14, (n, cold)
        assert warm["programs_compiled"] == 0 and warm["cache_hits"] == cold["programs_compiled"], (n, warm)
        assert row["unroll"]["lower_plus_compile_s"] > 0 and row["scan"]["lower_plus_compile_s"] > 0
    second = depths["4"]["strata_new_depth"]  # the quick plan runs one round: 2, then 4
    assert depths["2"]["strata_new_depth"] is None
    # one bundle serves every depth: nothing exported, nothing compiled
    assert not second["exported"] and second["programs_compiled"] == 0, second
    assert second["cache_hits"] == depths["4"]["strata_cold"]["programs_compiled"]
    md = (tmp_path / "README.md").read_text()
    assert "strata after another depth" in md and "(0 compiled)" in md


def test_mesh_strings_overrides_and_policies() -> None:
    assert R.parse_mesh("1") == {"data": 1, "fsdp": 1, "tensor": 1}
    m = R.parse_mesh("tensor=2, data=2")
    assert m == {"data": 2, "fsdp": 1, "tensor": 2} and R.mesh_name(m) == "data=2,tensor=2"
    assert R.mesh_devices(m) == 4 and R.mesh_name(R.parse_mesh("data=1")) == "1"
    assert R.mesh_overrides(R.parse_mesh("fsdp=4")) == ["parallel.data=1", "parallel.fsdp=4", "parallel.tensor=1"]
    for bad in ("", "data", "data=0", "data=x", "pipe=2", "data=2,data=2", "data=1,data=2"):
        with pytest.raises(ValueError):
            R.parse_mesh(bad)
    pol = {t: R.parallel_policies(R.parse_mesh(t)) for t in
           ("1", "data=2", "fsdp=2", "tensor=2", "data=2,tensor=2", "data=2,fsdp=2")}
    assert list(pol["1"]) == list(pol["tensor=2"]) == ["default"]  # no strata collectives to place or overlap
    assert pol["1"]["default"] == ["sched.grad_reduce=per_layer", "sched.wait=deferred"]
    assert list(pol["data=2"]) == list(pol["data=2,tensor=2"]) == ["default", "bucketed", "wait=eager"]
    assert list(pol["fsdp=2"]) == ["default", "gather_prefetch=0", "reshard_after_forward=false", "wait=eager"]
    assert pol["fsdp=2"]["reshard_after_forward=false"] == ["sched.reshard_after_forward=false"]
    assert list(pol["data=2,fsdp=2"]) == ["default", "bucketed", "gather_prefetch=0",
                                          "reshard_after_forward=false", "wait=eager"]
    assert pol["data=2"]["wait=eager"] == ["sched.grad_reduce=per_layer", "sched.wait=eager"]
    # every preset's meshes parse, and the full plan has each kind the trainer runs
    for plan in (R.FULL, R.QUICK):
        assert plan.parallel is not None and [R.mesh_name(R.parse_mesh(t)) for t in plan.parallel.meshes]
    assert {"data=2", "fsdp=2", "tensor=2", "data=2,tensor=2"} <= set(R.FULL.parallel.meshes)
    # gpu_report: data meshes as far as the devices go, plus fsdp=2 and tensor=2 from 2 devices
    assert G.gpu_meshes(1) == ["1"]
    assert G.gpu_meshes(2) == ["1", "data=2", "fsdp=2", "tensor=2"]
    assert G.gpu_meshes(8) == ["1", "data=2", "data=4", "data=8", "fsdp=2", "tensor=2"]


def test_parallel_ratios_and_report() -> None:
    metrics = [{"step": i + 1, "loss": 1.0, "step_time_s": 0.1, "collectives": 4, "collective_bytes": 1000,
                "collective_s": c, "comm_overlap_ratio": r}
               for i, (c, r) in enumerate([(0.5, 0.1), (0.002, 0.9), (0.004, 0.7), (0.003, None)])]
    s = R.comm_summary(metrics, warmup=1)
    assert s["collectives"] == 4 and s["collective_s"] == pytest.approx(0.003)
    assert s["comm_overlap_ratio"] == pytest.approx(0.8)  # the null one left out, not counted as 0
    assert R.comm_summary([{"step": 1, "step_time_s": 0.1}], 0)["comm_overlap_ratio"] is None
    st = {"median_s": 0.2, "peak_live_bytes": 2000, "collectives": 4, "collective_bytes": 3000,
          "collective_s": 0.01, "comm_overlap_ratio": 0.5}
    res = {"config": "c.yml", "overrides": [], "steps": 6, "warmup": 2, "rounds": 1, "cpu_devices": 4, "meshes": {
        "1": {"data": 1, "strata": {"default": {"median_s": 0.1, "peak_live_bytes": 4000}},
              "anchor": {"median_s": 0.05, "xla_peak_bytes_estimate": 8000}, "runs": {"anchor": [{"other_load": 0.1}]}},
        "data=2": {"data": 2, "strata": {"default": st, "bucketed": {**st, "comm_overlap_ratio": 0.25}},
                   "anchor": {"median_s": 0.4, "xla_peak_bytes_estimate": 1000}, "runs": {}},
        "fsdp=2": {"fsdp": 2, "strata": {"default": {**st, "median_s": 0.3, "peak_live_bytes": 1000},
                                         "reshard_after_forward=false": {**st, "peak_live_bytes": 1500}},
                   "anchor": {"median_s": 0.15, "xla_peak_bytes_estimate": 500}, "runs": {}},
        "tensor=2": {"tensor": 2, "strata": {"default": {"median_s": 0.1, "peak_live_bytes": 3000, "collectives": 0,
                                                         "collective_bytes": 0, "collective_s": 0,
                                                         "comm_overlap_ratio": None}},
                     "anchor": None, "runs": {}}}}
    R.parallel_ratios(res)
    r2 = res["meshes"]["data=2"]["ratio"]
    assert r2["step_vs_one_device"] == pytest.approx(2.0) and r2["peak_vs_one_device"] == pytest.approx(0.5)
    assert r2["step_vs_anchor"] == pytest.approx(0.5) and r2["peak_vs_anchor"] == pytest.approx(2.0)
    rf = res["meshes"]["fsdp=2"]["ratio"]
    assert rf["step_vs_one_device"] == pytest.approx(3.0) and rf["peak_vs_one_device"] == pytest.approx(0.25)
    assert rf["step_vs_anchor"] == pytest.approx(2.0) and rf["peak_vs_anchor"] == pytest.approx(2.0)
    rt = res["meshes"]["tensor=2"]["ratio"]
    assert rt["peak_vs_one_device"] == pytest.approx(0.75) and rt["step_vs_anchor"] is None  # no anchor run
    assert res["meshes"]["1"]["ratio"]["step_vs_one_device"] == pytest.approx(1.0)
    md = "\n".join(R.parallel_markdown(res))
    assert "| data=2 | 200 ms | 2 | 400 ms | 0.5 | 1.95 KiB | 0.5 | 0.977 KiB | 2 |" in md
    assert "| fsdp=2 | 300 ms | 3 | 150 ms | 2 | 0.977 KiB | 0.25 | 0.488 KiB | 2 |" in md
    assert "| tensor=2 | 100 ms | 1 | – | – | 2.93 KiB | 0.75 | – | – |" in md
    assert "| data=2 | bucketed | 200 ms | 4 | 2.93 KiB | 10 ms | 0.25 | 1.95 KiB |" in md
    assert "| fsdp=2 | reshard_after_forward=false | 200 ms | 4 | 2.93 KiB | 10 ms | 0.5 | 1.46 KiB |" in md
    assert "| tensor=2 | default | 100 ms | 0 | 0 KiB | 0 ms | – | 2.93 KiB |" in md
    assert "| 1 device |" in md and "| 1 device | default" not in md  # no overlap row without collectives


@pytest.mark.long
def test_quick_parallel_section_end_to_end(tmp_path: Any) -> None:
    """`bench/run.py --quick --sections parallel` with real processes, 4 CPU
    devices: every mesh (1, data=2, fsdp=2, tensor=2) of strata and of the
    anchor over the same mesh ran, each under its policies, the data and
    fsdp meshes with their collectives counted and an overlap ratio;
    accounted per-device peaks shrink with the mesh. No timing is asserted. ~60 s."""
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CACHE_DIR"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--sections", "parallel",
                        "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(next(tmp_path.glob("*.json")).read_text())["parallel"]
    assert list(res["meshes"]) == ["1", "data=2", "fsdp=2", "tensor=2"] and res["cpu_devices"] == 4
    one = res["meshes"]["1"]
    assert list(one["strata"]) == ["default"] and one["strata"]["default"]["comm_overlap_ratio"] is None
    assert one["anchor"]["mesh"] == {"data": 1, "fsdp": 1, "tensor": 1}
    want = {"data=2": ["bucketed", "default", "wait=eager"],
            "fsdp=2": ["default", "gather_prefetch=0", "reshard_after_forward=false", "wait=eager"],
            "tensor=2": ["default"]}
    for name, pols in want.items():
        row = res["meshes"][name]
        mesh = R.parse_mesh(name)
        assert {k: row[k] for k in R.MESH_AXES} == mesh and row["devices"] == 2
        assert sorted(row["strata"]) == pols, name
        assert row["anchor"]["mesh"] == mesh and row["anchor"]["median_s"] > 0
        for pol, st in row["strata"].items():
            assert st["devices"] == 2 and st["median_s"] > 0, (name, pol, st)
            if name == "tensor=2":  # its all-reduces are inside the tensor-parallel programs
                assert not st["collectives"] and st["comm_overlap_ratio"] is None, (name, pol, st)
            else:
                assert st["collectives"] > 0, (name, pol, st)
                assert st["comm_overlap_ratio"] is not None and 0 <= st["comm_overlap_ratio"] <= 1, (name, pol, st)
        if name == "data=2":
            assert all(st["collectives"] == 4 for st in row["strata"].values())  # head, 2 blocks, embedding
        rt = row["ratio"]
        assert all(rt[k] is not None for k in ("step_vs_one_device", "step_vs_anchor", "peak_vs_anchor"))
        assert rt["peak_vs_one_device"] < 1, name  # each device holds its share of activations or parameters
    fs = res["meshes"]["fsdp=2"]["strata"]
    # keeping the gathered parameters from the forward to the backward saves the backward's all-gathers
    assert fs["reshard_after_forward=false"]["collectives"] < fs["default"]["collectives"]
    md = (tmp_path / "README.md").read_text()
    assert "### Parallel: meshes on 4 CPU devices" in md and "| data=2 | wait=eager |" in md
    assert "| fsdp=2 | gather_prefetch=0 |" in md and "| tensor=2 | default |" in md


def _pipe_step(i: int, busy: list[float], acts: list[int], predicted_acts: list[int] | None = None) -> dict[str, Any]:
    """One metrics step line of a pipeline run: stage s holds acts[s] activation bytes."""
    predicted_acts = predicted_acts or acts

    def cats(a: int) -> dict[str, int]:
        return {"params": 100, "grads": 200, "optimizer": 300, "activations": a, "transfer": 8, "gathered": 0,
                "unreduced": 0}

    return {"step": i + 1, "loss": 1.0, "step_time_s": 0.02 + 0.001 * i, "peak_live_bytes": 600 + max(acts),
            "peak_live_by_category": cats(max(acts)),
            "pipeline": {"stages": len(busy), "sends": 25, "send_bytes": 4096, "send_s": 0.001,
                         "send_overlap_ratio": 0.5 + 0.1 * i, "span_s": 0.02, "bubble": 0.3, "bubble_predicted": 0.164,
                         "bubble_theory": 1 / 9,
                         "stage": [{"busy_s": b, "peak_by_category": cats(a), "peak_by_category_predicted": cats(p)}
                                   for b, a, p in zip(busy, acts, predicted_acts)]}}


def test_pipeline_variants_summary_ratios_and_report() -> None:
    assert "pipeline" in R.SECTIONS and R.SECTIONS.index("pipeline") == R.SECTIONS.index("parallel") + 1
    for plan in (R.FULL, R.QUICK):
        pp = plan.pipeline
        assert pp is not None and pp.stages == [2, 4] and pp.schedules == ["gpipe", "1f1b", "interleaved"]
        assert "model.n_layers=8" in pp.overrides and "train.microbatches=8" in pp.overrides
        assert "sched.remat=none" in pp.overrides and pp.cpu_devices >= max(pp.stages) and pp.steps > pp.warmup
    vs = R.pipeline_variants(R.QUICK.pipeline)
    assert [v["name"] for v in vs] == ["1 device", "pipeline=2 gpipe", "pipeline=2 1f1b", "pipeline=2 interleaved V=2",
                                       "fsdp=2", "pipeline=4 gpipe", "pipeline=4 1f1b", "pipeline=4 interleaved V=2",
                                       "fsdp=4"]
    by = {v["name"]: v for v in vs}
    assert by["1 device"]["overrides"] == ["parallel.pipeline=1", "parallel.data=1", "parallel.fsdp=1",
                                           "parallel.tensor=1", "sched.pipeline_schedule=1f1b",
                                           "sched.pipeline_virtual=1"]
    assert "sched.pipeline_virtual=2" in by["pipeline=4 interleaved V=2"]["overrides"]
    assert "sched.pipeline_virtual=1" in by["pipeline=4 gpipe"]["overrides"]  # V > 1 is refused off interleaved
    assert "parallel.fsdp=4" in by["fsdp=4"]["overrides"] and "parallel.pipeline=1" in by["fsdp=4"]["overrides"]
    assert [(v["kind"], v["devices"]) for v in vs if v["kind"] != "pipeline"] == [("one", 1), ("fsdp", 2), ("fsdp", 4)]

    # summary: medians over the measured steps, peaks the largest over every line (warm-up included)
    metrics = [_pipe_step(0, [0.9, 0.9], [5000, 100]), _pipe_step(1, [0.010, 0.012], [2000, 1000]),
               _pipe_step(2, [0.014, 0.016], [2000, 1000]), _pipe_step(3, [0.012, 0.020], [2000, 1000]),
               {"step": 4, "eval_loss": 2.0}]
    s = R.pipeline_summary(metrics, warmup=1)
    assert s["sends"] == 25 and s["send_overlap_ratio"] == pytest.approx(0.7) and s["bubble_theory"] == pytest.approx(1 / 9)
    assert [st["busy_s"] for st in s["stage"]] == [pytest.approx(0.012), pytest.approx(0.016)]
    assert [st["peak_by_category"]["activations"] for st in s["stage"]] == [5000, 1000]
    assert all(st["matches_prediction"] for st in s["stage"])
    assert s["peak_live_by_category"]["activations"] == 5000  # the line of the largest peak_live_bytes
    off = R.pipeline_summary([*metrics[:3], _pipe_step(3, [0.01, 0.01], [2000, 1001], [2000, 1000])], warmup=1)
    assert [st["matches_prediction"] for st in off["stage"]] == [True, False]
    one = R.pipeline_summary([{"step": 1, "step_time_s": 0.1, "peak_live_bytes": 900,
                               "peak_live_by_category": {"activations": 300}}], 0)
    assert one["stage"] == [] and one["bubble"] is None and one["peak_live_by_category"] == {"activations": 300}
    assert R.pipeline_activations_peak({"pipeline": s}) == 5000
    assert R.pipeline_activations_peak({"pipeline": one}) == 300 and R.pipeline_activations_peak({}) is None

    # ratios against one device and against fsdp over as many devices
    def row(v: dict[str, Any], median_s: float, peak: int, **extra: Any) -> dict[str, Any]:
        best = {"median_s": median_s, "peak_live_bytes": peak, "pipeline": one, **extra}
        return {**{k: v[k] for k in ("kind", "devices", "stages", "schedule", "virtual", "overrides")},
                "best": best, "runs": [{"other_load": 0.1}]}

    res = {"config": "c.yml", "overrides": ["model.n_layers=8"], "steps": 8, "warmup": 3, "rounds": 1,
           "cpu_devices": 4, "cpus": 2, "variants": {
               "1 device": row(by["1 device"], 0.1, 4000),
               "pipeline=2 gpipe": row(by["pipeline=2 gpipe"], 0.2, 6000, pipeline=s),
               "fsdp=2": row(by["fsdp=2"], 0.4, 2000, collectives=233, collective_bytes=2**20,
                             comm_overlap_ratio=0.43),
               "pipeline=4 1f1b": {**row(by["pipeline=4 1f1b"], 0.05, 1000), "best": None}}}
    R.pipeline_ratios(res)
    r = res["variants"]["pipeline=2 gpipe"]["ratio"]
    assert r["step_vs_one_device"] == pytest.approx(2.0) and r["step_vs_fsdp"] == pytest.approx(0.5)
    assert r["peak_vs_one_device"] == pytest.approx(1.5) and r["peak_vs_fsdp"] == pytest.approx(3.0)
    assert res["variants"]["fsdp=2"]["ratio"]["step_vs_fsdp"] == pytest.approx(1.0)
    assert res["variants"]["1 device"]["ratio"]["step_vs_fsdp"] is None  # no fsdp over one device
    assert res["variants"]["pipeline=4 1f1b"]["ratio"]["step_vs_one_device"] is None  # no run, no fsdp=4
    md = "\n".join(R.pipeline_markdown(res))
    assert "### Pipeline: stages and schedules on 4 CPU devices, against one device and fsdp" in md
    assert "| 1 device | 1 | 100 ms | 1 | – | 3.91 KiB | 1 | – | 0.293 KiB | – | – | – | – | – | 0.10 |" in md
    assert ("| pipeline=2 gpipe | 2 | 200 ms | 2 | 0.5 | 5.86 KiB | 1.5 | 3 | 4.88 KiB | 0.3 | 0.164 | 0.111 | "
            "25 sends, 4 KiB | 0.7 | 0.10 |") in md
    assert "| fsdp=2 | 2 | 400 ms | 4 | 1 | 1.95 KiB | 0.5 | 1 | 0.293 KiB | – | – | – | 233 collectives, 1 MiB | 0.43 |" in md
    assert "| pipeline=4 1f1b | 4 | – | – | – |" in md
    assert ("| pipeline=2 gpipe | 0 | 12 ms | 4.88 KiB | 0.0977 KiB / 0.195 KiB / 0.293 KiB / 4.88 KiB / "
            "0.00781 KiB / 0 KiB / 0 KiB | yes |") in md
    assert "| pipeline=2 gpipe | 1 | 16 ms | 0.977 KiB |" in md and "| 1 device | 0 |" not in md
    assert "What 2 CPU cores shared by 4 CPU devices can and cannot show" in md
    assert "the measured bubble reflects how the cores were shared" in md and "The per-stage peaks are exact" in md
    # the whole report carries the section
    env = {"date": "d", "host": "h", "cpus": 2, "cpu": "c", "git_commit": "abc", "git_dirty": False, "jax": "j",
           "loadavg_start": (0.1, 0.2, 0.3)}
    assert "### Pipeline: stages and schedules" in R.markdown({"environment": env, "pipeline": res, "targets": []})


@pytest.mark.long
def test_quick_pipeline_section_end_to_end(tmp_path: Any) -> None:
    """`bench/run.py --quick --sections pipeline` with real processes on 4
    CPU devices: one device, P=2 and P=4 under each schedule, fsdp=2 and 4.
    Checks what does not depend on the load: each stage's peaks equal the
    plan's, the schedules' activation peaks order as their theory says, the
    theory bubble's formula, the sends. No timing is asserted. ~40 s."""
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CACHE_DIR"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--sections", "pipeline",
                        "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(next(tmp_path.glob("*.json")).read_text())["pipeline"]
    vs = res["variants"]
    assert list(vs) == [v["name"] for v in R.pipeline_variants(R.QUICK.pipeline)]
    for name, row in vs.items():
        st = row["best"]
        assert st["median_s"] > 0 and st["peak_live_bytes"] > 0, name
        pl = st["pipeline"]
        if row["kind"] != "pipeline":
            assert pl["stage"] == [] and pl["sends"] is None, name
            continue
        p, v, m = row["stages"], row["virtual"], 8
        assert len(pl["stage"]) == p and all(s["matches_prediction"] for s in pl["stage"]), name
        assert pl["sends"] > 0 and pl["send_bytes"] > 0 and 0 <= pl["send_overlap_ratio"] <= 1, name
        assert pl["bubble_theory"] == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-4), name
        assert 0 <= pl["bubble"] < 1 and pl["bubble_predicted"] >= pl["bubble_theory"] - 1e-4, name
    acts = {n: [s["peak_by_category"]["activations"] for s in row["best"]["pipeline"]["stage"]]
            for n, row in vs.items() if row["kind"] == "pipeline"}
    # 1F1B: stage s holds P - s microbatches, GPipe every one of the M on every stage
    assert acts["pipeline=4 1f1b"] == sorted(acts["pipeline=4 1f1b"], reverse=True)
    assert acts["pipeline=4 gpipe"][0] > 1.5 * acts["pipeline=4 1f1b"][0]
    assert vs["fsdp=2"]["best"]["collectives"] > 0 and vs["fsdp=4"]["ratio"]["step_vs_fsdp"] == pytest.approx(1.0)
    assert vs["pipeline=2 1f1b"]["ratio"]["step_vs_fsdp"] is not None
    md = (tmp_path / "README.md").read_text()
    assert "### Pipeline: stages and schedules on 4 CPU devices" in md and "| pipeline=4 interleaved V=2 | 3 |" in md


def _pack_metrics(times: list[float], data_s: list[float], weights: list[float] | None) -> list[dict[str, Any]]:
    """Metrics step lines of a packing run (2048 tokens a step), then the final evaluation's line."""
    out: list[dict[str, Any]] = []
    for i, (t, d) in enumerate(zip(times, data_s)):
        m = {"step": i + 1, "loss": 1.0, "tokens": 2048, "step_time_s": t, "data_s": d, "wait_s": t / 2}
        if weights is not None:
            m["loss_weight"] = weights[i]
        out.append(m)
    return [*out, {"step": len(times), "eval_loss": 2.0}]


def test_packing_summary_ratios_and_report() -> None:
    assert R.SECTIONS.index("packing") == R.SECTIONS.index("pipeline") + 1
    for plan in (R.FULL, R.QUICK):
        pk = plan.packing
        assert pk is not None and pk.modes == ["concat", "none", "pack"] and "data.separator=%" in pk.overrides
        assert pk.steps > pk.warmup and pk.rounds >= 1
    assert R.FULL.packing.config == "configs/tiny.yml" and R.FULL.packing.overrides == ["data.separator=%"]
    assert "data.synthetic=false" in R.QUICK.packing.overrides  # synthetic tokens have no documents
    assert R.PACKING_KERNELS == []  # strata's default kernels: the ffi attention's segment form under pack
    times, data = [0.9, 0.5, 0.1, 0.3, 0.2], [0.01, 0.01, 0.0001, 0.0003, 0.0004]
    s = R.packing_summary(_pack_metrics(times, data, [0, 0, 1800, 1900, 2000]), warmup=2, mode="pack")
    assert s["n"] == 3 and s["median_s"] == pytest.approx(0.2) and s["tokens_per_step"] == 2048
    assert s["tokens_per_s"] == pytest.approx(10240) and s["loss_weight_per_step"] == pytest.approx(1900)
    assert s["effective_tokens_per_s"] == pytest.approx(9500) and s["weight_fraction"] == pytest.approx(1900 / 2048)
    assert s["data_s_median"] == pytest.approx(0.0003)
    assert s["data_fraction"] == pytest.approx(0.001) and s["data_fraction_max"] == pytest.approx(0.002)
    # concat reports no loss_weight: every target counts
    c = R.packing_summary(_pack_metrics(times, data, None), warmup=2, mode="concat")
    assert c["loss_weight_per_step"] == 2048 and c["effective_tokens_per_s"] == pytest.approx(10240)
    # none/pack from a build without loss_weight: not measured, not taken for every target
    bare = R.packing_summary(_pack_metrics(times, data, None), warmup=2, mode="none")
    assert bare["loss_weight_per_step"] is None and bare["effective_tokens_per_s"] is None
    assert bare["tokens_per_s"] == pytest.approx(10240)
    nodata = R.packing_summary([{"step": 1, "step_time_s": 0.2, "tokens": 8}], warmup=0, mode="concat")
    assert nodata["data_fraction"] is None and nodata["data_s_median"] is None and nodata["tokens_per_s"] == 40

    def run(rnd: int, median_s: float, eff: float, **extra: Any) -> dict[str, Any]:
        return {"round": rnd, "median_s": median_s, "tokens_per_s": 2048 / median_s, "effective_tokens_per_s": eff,
                "other_load": 0.1 * rnd, **extra}

    cr = [run(0, 0.2, 10240, cpu_s_per_step=0.4), run(1, 0.21, 2048 / 0.21)]
    pr = [run(0, 0.25, 7600, cpu_s_per_step=0.38), run(1, 0.26, 7000)]
    best = {"loss_weight_per_step": 1900, "weight_fraction": 1900 / 2048, "data_s_median": 1.6e-5,
            "data_fraction": 8e-5, "data_fraction_max": 1e-4}
    res = {"config": "configs/tiny.yml", "overrides": ["data.separator=%"], "kernels": R.PACKING_KERNELS,
           "steps": 25, "warmup": 5, "rounds": 2,
           "variants": {"concat": {"overrides": ["data.packing=concat"], "runs": cr,
                                   "best": {**cr[0], **best, "loss_weight_per_step": 2048, "weight_fraction": 1.0,
                                            "data_fraction": 5e-5}},
                        "none": {"overrides": ["data.packing=none"], "runs": [], "best": None},
                        "pack": {"overrides": ["data.packing=pack"], "runs": pr, "best": {**pr[0], **best}}}}
    R.packing_ratios(res)
    r = res["variants"]["pack"]["ratio"]
    assert r["step_vs_concat"] == pytest.approx(1.25) and r["tokens_per_s_vs_concat"] == pytest.approx(0.8)
    assert r["effective_vs_concat"] == pytest.approx(0.7421875) and r["cpu_vs_concat"] == pytest.approx(0.95)
    assert r["effective_vs_concat_per_round"] == pytest.approx([0.7421875, 7000 / (2048 / 0.21)])
    assert res["variants"]["concat"]["ratio"]["effective_vs_concat"] == 1
    assert res["variants"]["none"]["ratio"] == {"step_vs_concat": None, "tokens_per_s_vs_concat": None,
                                                "effective_vs_concat": None, "cpu_vs_concat": None,
                                                "effective_vs_concat_per_round": []}
    md = "\n".join(R.packing_markdown(res))
    assert ("### Packing: data.packing on one corpus (configs/tiny.yml data.separator=%, default kernels, "
            "20+5 steps, best of 2 interleaved round(s))") in md
    assert ("| pack | 250 ms | 8192 | 1900 (92.8 %) | 7600 | 1.25 | 0.8 | 0.742 | 0.742, 0.718 | 0.38 | 0.95 | "
            "16 µs | 0.008 %, 0.01 % | 0.00, 0.10 |") in md
    assert "| concat | 200 ms | 10240 | 2048 (100 %) | 10240 | 1 | 1 | 1 | 1, 1 | 0.4 | 1 |" in md
    assert "| none | – | – | – (–) | – | – | – | – |  | – | – | – | –, – |  |" in md
    t = {x["target"]: x for x in R.targets({"packing": res})}
    assert t["batch fill / step, data.packing=concat (configs/tiny.yml)"]["value"] == pytest.approx(5e-5)
    assert t["batch fill / step, data.packing=pack (configs/tiny.yml)"]["met"] is True
    assert t["batch fill / step, data.packing=none (configs/tiny.yml)"]["met"] is None  # no run: not measured
    env = {"date": "d", "host": "h", "cpus": 2, "cpu": "c", "git_commit": "abc", "git_dirty": False, "jax": "j",
           "loadavg_start": (0.1, 0.2, 0.3)}
    full = R.markdown({"environment": env, "packing": res, "targets": R.targets({"packing": res})})
    assert "### Packing: data.packing on one corpus" in full
    assert "| batch fill / step, data.packing=pack (configs/tiny.yml) | 8e-05 | 0.01 | yes |" in full


@pytest.mark.long  # ~15 s of training; make test-long
def test_quick_packing_section_end_to_end(tmp_path: Any) -> None:
    """`bench/run.py --quick --sections packing` with real processes,
    test.yml's model on fortunes split at `%` under concat, none and pack.
    Checks what does not depend on the load: the tokens per step, the
    targets that count (every one under concat, fewer under none than under
    pack: one document per sequence pads more), a batch fill measured for
    every variant. No timing is asserted. ~15 s (six short runs, three
    exports)."""
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CACHE_DIR"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--sections", "packing",
                        "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(next(tmp_path.glob("*.json")).read_text())["packing"]
    vs = res["variants"]
    assert list(vs) == ["concat", "none", "pack"] and res["kernels"] == R.PACKING_KERNELS
    tokens = 4 * 64  # test.yml's batch at the quick preset's model.seq_len
    for mode, row in vs.items():
        st = row["best"]
        assert st["median_s"] > 0 and st["tokens_per_step"] == tokens, mode
        assert st["data_s_median"] is not None and 0 <= st["data_fraction"] <= st["data_fraction_max"] < 1, mode
        assert 0 < st["loss_weight_per_step"] <= tokens, mode
    assert vs["concat"]["best"]["loss_weight_per_step"] == tokens
    assert vs["none"]["best"]["loss_weight_per_step"] < vs["pack"]["best"]["loss_weight_per_step"] < tokens
    for mode in ("none", "pack"):
        assert vs[mode]["ratio"]["effective_vs_concat"] is not None, mode
    md = (tmp_path / "README.md").read_text()
    assert "### Packing: data.packing on one corpus (configs/test.yml" in md and "| pack |" in md
    assert "batch fill / step, data.packing=pack (configs/test.yml)" in md


def test_remat_ratios_budget_and_report() -> None:
    assert R.remat_budget_between(1000, 900) == 999
    with pytest.raises(ValueError):
        R.remat_budget_between(900, 900)
    run = {"median_s": 0.2, "other_load": 0.1, "round": 0}
    res = {"config": "c.yml", "overrides": [], "steps": 8, "warmup": 2, "rounds": 1, "none_peak_bytes": 2000,
           "full_peak_bytes": 1000, "budget_bytes": 1999,
           "previous": {"rev": "HEAD^", "commit": "0123456789abcdef", "build_s": 30.0},
           "choices": {"auto": {"policy": "remat=auto:none memory_budget=0 offload=none", "remat": {}},
                       "auto with a budget": {"policy": "remat=auto:0 memory_budget=1999 offload=none"}},
           "runs": {k: [run] for k in ("auto", "none", "full", "auto with a budget", "previous default",
                                      "previous full")},
           "best": {"auto": {"median_s": 0.2, "all_medians_s": [0.2], "recomputes": 0, "peak_live_bytes": 2000},
                    "none": {"median_s": 0.2, "all_medians_s": [0.2], "recomputes": 0},
                    "full": {"median_s": 0.25, "all_medians_s": [0.25], "recomputes": 8},
                    "auto with a budget": {"median_s": 0.21, "all_medians_s": [0.21], "recomputes": 2},
                    "previous default": {"median_s": 0.25, "all_medians_s": [0.25]},
                    "previous full": {"median_s": 0.25, "all_medians_s": [0.25]}}}
    R.remat_ratios(res)
    r = res["ratio"]
    assert r["vs_none"]["auto"] == pytest.approx(1.0) and r["vs_none"]["full"] == pytest.approx(1.25)
    assert "none" not in r["vs_none"]
    assert r["default_vs_previous_default"] == pytest.approx(0.8) and r["full_vs_previous_full"] == pytest.approx(1.0)
    md = "\n".join(R.remat_markdown(res))
    assert "| auto | 200 ms | 200 | 1 | 0 | 1.95 KiB | `remat=auto:none memory_budget=0` | 0.10 |" in md
    assert "| auto with a budget | 210 ms | 210 | 1.05 | 2 |" in md and "`remat=auto:0 memory_budget=1999`" in md
    assert "default plan 0.8×, full remat 1×" in md and "HEAD^ = `0123456789ab`" in md
    t = {x["target"]: x for x in R.targets({"remat": res})}
    assert t["step time sched.remat=auto (no budget) / none (c.yml)"]["met"] is True
    assert t["1-device default step / previous commit's (c.yml)"]["value"] == pytest.approx(0.8)
    res["previous"], res["previous_error"] = None, "git archive: no such commit"
    assert "Previous commit: not measured (git archive: no such commit)" in "\n".join(R.remat_markdown(res))


def _quick_remat(tmp_path: Any, *previous: str) -> dict[str, Any]:
    """Runs `bench/run.py --quick --sections remat PREVIOUS...` and checks
    this commit's part: auto (no budget) trains none's plan, auto with a
    budget recomputes some layers (fewer than full) within it. No timing is
    asserted. Returns the remat section's results."""
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CACHE_DIR"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--sections", "remat",
                        *previous, "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(next(tmp_path.glob("*.json")).read_text())["remat"]
    best, ch = res["best"], res["choices"]
    assert best["auto"]["recomputes"] == best["none"]["recomputes"] == 0
    assert best["auto"]["peak_live_bytes"] == best["none"]["peak_live_bytes"] == res["none_peak_bytes"]
    assert 0 < best["auto with a budget"]["recomputes"] < best["full"]["recomputes"]
    assert best["auto with a budget"]["peak_live_bytes"] <= res["budget_bytes"] < res["none_peak_bytes"]
    assert ch["auto"]["remat"]["mode"] == "auto" and ch["auto"]["remat"]["recompute"] == []
    assert ch["auto with a budget"]["remat"]["fits"] is True
    assert all(v is not None for v in res["ratio"]["vs_none"].values())
    assert "### sched.remat on one device" in (tmp_path / "README.md").read_text()
    return res


@pytest.mark.long
def test_quick_remat_section_end_to_end(tmp_path: Any) -> None:
    """`bench/run.py --quick --sections remat --no-previous` with real
    processes: this commit's plans (the previous commit's build is
    test_quick_remat_section_against_the_previous_commit, a long drill)."""
    res = _quick_remat(tmp_path, "--no-previous")
    assert sorted(res["best"]) == sorted(["auto", "none", "full", "auto with a budget"])
    assert res["previous"] is None and res["ratio"]["default_vs_previous_default"] is None
    assert "Previous commit: not measured (--no-previous)." in (tmp_path / "README.md").read_text()


@pytest.mark.long
def test_quick_remat_section_against_the_previous_commit(tmp_path: Any) -> None:
    """A long drill (make test-long): `--base-commit HEAD`, HEAD built in a
    scratch folder runs the same preset (make test runs the section without
    it: test_quick_remat_section_end_to_end). ~2 min."""
    res = _quick_remat(tmp_path, "--base-commit", "HEAD")
    best, ch = res["best"], res["choices"]
    assert sorted(best) == sorted(["auto", "none", "full", "auto with a budget", "previous default", "previous full"])
    assert ch["previous full"]["policy"].startswith("remat=full ")
    assert res["previous"]["rev"] == "HEAD" and len(res["previous"]["commit"]) == 40
    assert res["ratio"]["default_vs_previous_default"] is not None
    assert "This commit against the previous one" in (tmp_path / "README.md").read_text()



def test_multiprocess_summary_fit_and_report() -> None:
    job = [{"step": i + 1, "loss": 1.0, "step_time_s": 0.1, "step_time_s_min": 0.09, "step_time_s_max": t,
            "slowest_rank": r, "processes": 2, "xprocs": 4, "xproc_bytes": 1000, "xproc_s": 0.01, "xproc_wait_s": 0.002,
            "xproc_overlap_ratio": o} for i, (t, r, o) in enumerate([(0.9, 0, 0.1), (0.12, 1, 0.5), (0.14, 1, None)])]
    s = R.mp_summary(job, warmup=1)
    assert s["median_s"] == pytest.approx(0.13) and s["step_time_s"] == pytest.approx(0.1)  # the slowest rank's
    assert s["xproc_overlap_ratio"] == pytest.approx(0.5) and s["slowest_rank_counts"] == {"1": 2} and s["n"] == 2
    assert s["comm_overlap_ratio"] is None  # one device per process: no in-process collectives
    one = R.mp_summary([{"step": 1, "step_time_s": 0.2, "comm_overlap_ratio": 0.7}], 0)
    assert one["median_s"] == pytest.approx(0.2) and one["xproc_bytes"] is None
    r = R.mp_ratios({"one_process": one, "processes": s})
    assert r == {"step_time": pytest.approx(0.65), "overlap_one_process": 0.7, "overlap_across_processes": 0.5}
    # t = A + B n recovered exactly from points on the line; alpha = A / 2 (2 ranks: two messages)
    pts = [{"bytes": n, "median_s": 1e-4 + 1e-9 * n} for n in (4, 1024, 1 << 20, 64 << 20)]
    f = R.fit_alpha_beta(pts)
    assert f["A_s"] == pytest.approx(1e-4) and f["B_s_per_byte"] == pytest.approx(1e-9)
    assert f["alpha_s"] == pytest.approx(5e-5) and f["bandwidth_GBps"] == pytest.approx(1.0)
    assert f["max_rel_residual"] < 1e-9
    with pytest.raises(ValueError):
        R.fit_alpha_beta(pts[:1])
    # the model at P=2 is the fitted line; at 512 hosts the latency term grows with 2(P-1) per collective
    assert R.allreduce_model_s(f["alpha_s"], f["beta_s_per_byte"], 1 << 20, 2) == pytest.approx(1e-4 + 1e-9 * (1 << 20))
    assert R.allreduce_model_s(5e-6, 0, 0, 512, collectives=10) == pytest.approx(10 * 2 * 511 * 5e-6)
    assert R.allreduce_model_s(1, 1, 100, 1) == 0
    est = R.scaling_estimate(f, 500_000_000, 150)
    assert [(e["network"], e["hosts"]) for e in est] == [(n, h) for n in ("100 Gb/s, 5 us", "loopback fit")
                                                         for h in (8, 64, 512)]
    e8 = est[0]
    assert e8["bandwidth_s"] == pytest.approx(2 * 7 / 8 * 500_000_000 * 8 / 100e9)
    assert e8["latency_s"] == pytest.approx(150 * 2 * 7 * 5e-6) and e8["total_s"] == e8["latency_s"] + e8["bandwidth_s"]
    row = {"one_process": one, "processes": s, "ratio": r, "explain": {"wire_bytes_all_processes": 1000}}
    res = {"config": "c.yml", "overrides": [], "steps": 6, "warmup": 2, "rounds": 1, "cpus": 2,
           "meshes": {"data=2": row, "fsdp=2": {"one_process": one, "not_built": "strata: config error: fsdp", "ratio": {}}},
           "sweep": [{**p, "min_s": p["median_s"], "bytes_sent": p["bytes"]} for p in pts], "fit": f, "fit_least": f,
           "scale": {"config": "g.yml", "overrides": [], "grad_bytes": 500_000_000, "collectives": 150, "estimate": est}}
    md = "\n".join(R.multiprocess_markdown(res))
    assert "| data=2 | 200 ms | 130 ms | 0.65 | 0.7 | 0.5 | 0.977 KiB | 0.977 KiB | 10 ms | 2 ms |" in md
    assert "| fsdp=2 | 200 ms | not built |" in md and "fsdp=2 across processes: **not built**" in md
    assert "A = 100 µs" in md and "α = 50 µs" in md and "| 100 Gb/s, 5 us | 512 |" in md
    assert "least time instead: α = 50 µs, β = 1 ns/B (1 GB/s)" in md
    assert R.fit_alpha_beta(res["sweep"], "min_s")["A_s"] == pytest.approx(1e-4)
    assert "a model on paper, not a measurement" in md and "previous default" in md


@pytest.mark.long
def test_quick_multiprocess_section_end_to_end(tmp_path: Any) -> None:
    """A long drill (make test-long; make test keeps
    test_multiprocess_summary_fit_and_report, the section's summary, fit and
    report, and test_multiprocess.py's jobs of two processes trained against
    one): `bench/run.py --quick --sections multiprocess` with real processes:
    data=2 as 1 process x 2 devices and as 2 processes x 1 device under
    `mpirun --oversubscribe -np 2` (with Open MPI's root consent, set by
    the section), the bytes the job sent equal to `strata plan --explain`'s
    count, fsdp=2 across processes either refused (a "not built" row) or
    run; the engine's all-reduce sweep fitted. No timing is asserted. ~50 s
    on the loaded 2-core VM, most of it the two data=2 bundles' exports."""
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CACHE_DIR" and not k.startswith("OMPI_")}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "run.py"), "--quick", "--sections", "multiprocess",
                        "--out-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(next(tmp_path.glob("*.json")).read_text())["multiprocess"]
    assert list(res["meshes"]) == ["data=2", "fsdp=2"]
    d = res["meshes"]["data=2"]
    one, job = d["one_process"], d["processes"]
    assert one["median_s"] > 0 and one["collectives"] == 4 and one["xproc_bytes"] is None
    assert job["median_s"] > 0 and job["processes"] == 2 and job["xprocs"] == 4
    # what the two ranks sent through MPI per step is what --explain counts
    assert job["xproc_bytes"] == d["explain"]["wire_bytes_all_processes"] > 0, (job, d["explain"])
    assert 0 <= job["xproc_overlap_ratio"] <= 1 and job["xproc_s"] > 0 and job["xproc_wait_s"] >= 0
    assert d["ratio"]["step_time"] == pytest.approx(job["median_s"] / one["median_s"])
    fs = res["meshes"]["fsdp=2"]
    if fs.get("not_built"):  # until fsdp spans processes: strata's own refusal, no number (--quick: no export either)
        assert "fsdp" in fs["not_built"] and "processes" not in fs and "one_process" not in fs, fs
    else:
        assert fs["one_process"]["median_s"] > 0
        assert fs["processes"]["xproc_bytes"] == fs["explain"]["wire_bytes_all_processes"] > 0
    sw = res["sweep"]
    assert [p["bytes"] for p in sw] == [4 ** k for k in range(1, 11)]
    assert all(p["bytes_sent"] == 2 * -(-p["bytes"] // 8) * 4 and p["median_s"] > 0 for p in sw)
    assert res["fit"]["points"] == res["fit_least"]["points"] == 10
    assert res["scale"]["grad_bytes"] > 0 and len(res["scale"]["estimate"]) >= 3
    md = (tmp_path / "README.md").read_text()
    assert "### Multi-process: 1 process x 2 devices against 2 processes x 1 device" in md
    assert "| data=2 |" in md and "Scaling estimate (a model on paper" in md
