/* test_runtime_cache.c — the executable cache (hits across runtimes, misses
 * on changed options, damaged entries detected and replaced) and
 * deterministic execution. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "runtime/rt_internal.h"
#include "strata/runtime.h"
#include "test_util.h"

static tu_testprogs g_tp;

static const tu_prog* prog(const char* name) {
  const tu_prog* p = tu_testprogs_get(&g_tp, name);
  if (!p) fail_msg("test program %s missing from the index", name);
  return p;
}

static st_runtime* make_runtime(const char* cache_dir, const char* const* xla, int nxla, bool det, int devices) {
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cache_dir = cache_dir;
  o.xla_options = xla;
  o.xla_option_count = nxla;
  o.deterministic = det;
  o.cpu_devices = devices;
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&o, &rt));
  return rt;
}

static st_buffer* upload_to(st_runtime* rt, int device, const tu_tensor* t) {
  size_t n = 0;
  void* data = tu_read_file(t->file, &n);
  assert_non_null(data);
  st_buffer* b = NULL;
  ASSERT_OK(st_buffer_from_host(rt, device, &t->type, data, &b));
  free(data);
  return b;
}

static st_buffer* upload(st_runtime* rt, const tu_tensor* t) { return upload_to(rt, 0, t); }


/* Runs compiled program |prg| (test program |p|) on |device| and checks output 0. */
static void run_check_on(st_runtime* rt, st_program* prg, const tu_prog* p, int device) {
  st_buffer* in[TU_MAX_TENSORS];
  st_buffer* out[TU_MAX_TENSORS];
  for (int i = 0; i < p->n_in; ++i) in[i] = upload_to(rt, device, &p->in[i]);
  ASSERT_OK(st_program_execute(prg, device, in, p->n_in, out, p->n_out, NULL));
  size_t n = st_buffer_bytes(out[0]);
  void* got = malloc(n);
  ASSERT_OK(st_buffer_to_host(out[0], got, n));
  void* want = tu_read_file(p->out[0].file, NULL);
  char why[256];
  if (!tu_close(&p->out[0].type, got, want, 2e-6, 1e-6, why, sizeof(why))) fail_msg("%s: %s", p->name, why);
  free(got);
  free(want);
  for (int i = 0; i < p->n_out; ++i) st_buffer_destroy(out[i]);
  for (int i = 0; i < p->n_in; ++i) st_buffer_destroy(in[i]);
}

/* Compiles |p| (through the cache), runs it on |device| and checks output 0. */
static void compile_run_check_on(st_runtime* rt, const tu_prog* p, int device) {
  st_program* prg = NULL;
  ASSERT_OK(st_program_compile_file(rt, p->file, NULL, &prg));
  run_check_on(rt, prg, p, device);
  st_program_destroy(prg);
}

static void compile_run_check(st_runtime* rt, const tu_prog* p) { compile_run_check_on(rt, p, 0); }

static void expect_stats(st_runtime* rt, int64_t compiles, int64_t hits, int64_t misses, int64_t corrupt) {
  st_runtime_stats s;
  st_runtime_get_stats(rt, &s);
  if (s.compiles != compiles || s.cache_hits != hits || s.cache_misses != misses || s.cache_corrupt != corrupt)
    fail_msg("stats: compiles %lld hits %lld misses %lld corrupt %lld; expected %lld %lld %lld %lld",
             (long long)s.compiles, (long long)s.cache_hits, (long long)s.cache_misses, (long long)s.cache_corrupt,
             (long long)compiles, (long long)hits, (long long)misses, (long long)corrupt);
}

/* The single *.xexe entry in |dir| (path into |out|); fails if not one. */
static void only_entry(const char* dir, char* out, size_t out_size) {
  DIR* d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l > 5 && !strcmp(e->d_name + l - 5, ".xexe")) {
      snprintf(out, out_size, "%s/%s", dir, e->d_name);
      ++n;
    } else if (e->d_name[0] == '.' && strstr(e->d_name, ".tmp")) {
      fail_msg("temporary file left behind: %s", e->d_name);
    }
  }
  closedir(d);
  assert_int_equal(n, 1);
}

static int count_entries(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l > 5 && !strcmp(e->d_name + l - 5, ".xexe")) ++n;
  }
  closedir(d);
  return n;
}

/*===-------------------------------------------------------------------===*/

static void test_cache_hit(void** state) {
  (void)state;
  char* dir = tu_tmpdir("cache");
  char sub[1024];
  snprintf(sub, sizeof(sub), "%s/nested/xexe", dir); /* created on demand */
  const tu_prog* mp = prog("matmul");

  st_runtime* rt = make_runtime(sub, NULL, 0, false, 1);
  compile_run_check(rt, mp);
  expect_stats(rt, 1, 0, 1, 0);
  /* Same runtime, same program: loaded from the cache, not compiled. */
  compile_run_check(rt, mp);
  expect_stats(rt, 1, 1, 1, 0);
  st_runtime_destroy(rt);
  char entry[2048];
  only_entry(sub, entry, sizeof(entry));

  /* A new runtime (a new process, as far as the cache knows). */
  rt = make_runtime(sub, NULL, 0, false, 1);
  compile_run_check(rt, mp);
  expect_stats(rt, 0, 1, 0, 0);
  /* A different program is a different entry. */
  compile_run_check(rt, prog("reduction"));
  expect_stats(rt, 1, 1, 1, 0);
  st_runtime_destroy(rt);
  /* The cached executable is portable: it runs on device 1 too. */
  rt = make_runtime(sub, NULL, 0, false, 2);
  compile_run_check_on(rt, mp, 1);
  expect_stats(rt, 0, 1, 0, 0);
  st_runtime_destroy(rt);
  assert_int_equal(count_entries(sub), 2);
  tu_rmtree(dir);
  free(dir);
}

static void test_cache_option_change_misses(void** state) {
  (void)state;
  char* dir = tu_tmpdir("cache");
  const tu_prog* mp = prog("matmul");
  st_runtime* rt = make_runtime(dir, NULL, 0, false, 1);
  compile_run_check(rt, mp);
  st_runtime_destroy(rt);

  const char* opt_a[] = {"xla_cpu_enable_fast_math=false"};
  rt = make_runtime(dir, opt_a, 1, false, 1);
  compile_run_check(rt, mp);
  expect_stats(rt, 1, 0, 1, 0);
  st_runtime_destroy(rt);

  const char* opt_b[] = {"xla_cpu_enable_fast_math=true"};
  rt = make_runtime(dir, opt_b, 1, false, 1);
  compile_run_check(rt, mp);
  expect_stats(rt, 1, 0, 1, 0);
  st_runtime_destroy(rt);

  /* Deterministic mode changes the options too. */
  rt = make_runtime(dir, NULL, 0, true, 1);
  compile_run_check(rt, mp);
  expect_stats(rt, 1, 0, 1, 0);
  st_runtime_destroy(rt);

  /* The first setting again: a hit. */
  rt = make_runtime(dir, opt_a, 1, false, 1);
  compile_run_check(rt, mp);
  expect_stats(rt, 0, 1, 0, 0);
  st_runtime_destroy(rt);
  assert_int_equal(count_entries(dir), 4);
  tu_rmtree(dir);
  free(dir);
}

typedef enum { DAMAGE_FLIP_PAYLOAD, DAMAGE_TRUNCATE, DAMAGE_MAGIC, DAMAGE_EMPTY, DAMAGE_GARBAGE_WITH_SUM } damage;

static void damage_entry(const char* path, damage how) {
  size_t n = 0;
  unsigned char* data = tu_read_file(path, &n);
  assert_non_null(data);
  assert_true(n > 64);
  switch (how) {
    case DAMAGE_FLIP_PAYLOAD:
      for (size_t i = 40; i < n; i += 97) data[i] ^= 0x5a;
      break;
    case DAMAGE_TRUNCATE: n = 32 + (n - 32) / 2; break;
    case DAMAGE_MAGIC: data[0] ^= 0xff; break;
    case DAMAGE_EMPTY: n = 0; break;
    case DAMAGE_GARBAGE_WITH_SUM: {
      /* A well-formed entry whose payload is not an executable: only the
       * plugin can tell, and it must say so rather than crash. */
      for (size_t i = 32; i < n; ++i) data[i] = (unsigned char)(i * 131u + 7u);
      uint64_t sum = XXH64(data + 32, n - 32, 0);
      for (int i = 0; i < 8; ++i) data[24 + i] = (unsigned char)(sum >> (8 * i));
      break;
    }
  }
  assert_int_equal(tu_write_file(path, data, n), 0);
  free(data);
}

static void test_cache_corrupt_entries(void** state) {
  (void)state;
  const tu_prog* mp = prog("matmul");
  const damage kinds[] = {DAMAGE_FLIP_PAYLOAD, DAMAGE_TRUNCATE, DAMAGE_MAGIC, DAMAGE_EMPTY, DAMAGE_GARBAGE_WITH_SUM};
  for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); ++k) {
    char* dir = tu_tmpdir("cache");
    st_runtime* rt = make_runtime(dir, NULL, 0, false, 1);
    compile_run_check(rt, mp);
    st_runtime_destroy(rt);
    char entry[2048];
    only_entry(dir, entry, sizeof(entry));
    struct stat before;
    assert_int_equal(stat(entry, &before), 0);
    damage_entry(entry, kinds[k]);

    /* Detected, counted, recompiled; the result is still right. */
    rt = make_runtime(dir, NULL, 0, false, 1);
    compile_run_check(rt, mp);
    expect_stats(rt, 1, 0, 1, 1);
    st_runtime_destroy(rt);
    /* ... and the entry was rewritten whole, so the next runtime hits. */
    struct stat after;
    assert_int_equal(stat(entry, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    rt = make_runtime(dir, NULL, 0, false, 1);
    compile_run_check(rt, mp);
    expect_stats(rt, 0, 1, 0, 0);
    st_runtime_destroy(rt);
    tu_rmtree(dir);
    free(dir);
  }
}

/* deterministic=true: a program with large reductions (a 4M-element sum,
 * a column sum over 1024 rows, a dot with a 4096-long contraction), run 20
 * times, gives bitwise-identical results — and matches JAX closely. */
static void test_deterministic_repeatable(void** state) {
  (void)state;
  const tu_prog* bp = prog("bigreduce");
  st_runtime* rt = make_runtime(NULL, NULL, 0, true, 2);
  st_program* p = NULL;
  ASSERT_OK(st_program_compile_file(rt, bp->file, NULL, &p));
  st_buffer* in[2] = {upload(rt, &bp->in[0]), upload(rt, &bp->in[1])};
  void* first[3] = {0};
  for (int run = 0; run < 20; ++run) {
    st_buffer* out[3];
    ASSERT_OK(st_program_execute(p, 0, in, 2, out, 3, NULL));
    for (int i = 0; i < 3; ++i) {
      size_t n = st_buffer_bytes(out[i]);
      void* host = malloc(n);
      ASSERT_OK(st_buffer_to_host(out[i], host, n));
      st_buffer_destroy(out[i]);
      if (run == 0) {
        first[i] = host;
        void* want = tu_read_file(bp->out[i].file, NULL);
        char why[256];
        /* Long float sums: ordering differences vs JAX are expected to be
         * small but not zero. */
        if (!tu_close(&bp->out[i].type, host, want, 1e-3, 1e-2, why, sizeof(why)))
          fail_msg("bigreduce output %d vs JAX: %s", i, why);
        free(want);
      } else {
        if (memcmp(first[i], host, n)) fail_msg("run %d: output %d differs bitwise from run 0", run, i);
        free(host);
      }
    }
  }
  for (int i = 0; i < 3; ++i) free(first[i]);
  st_buffer_destroy(in[0]);
  st_buffer_destroy(in[1]);
  st_program_destroy(p);
  st_runtime_destroy(rt);
}

/* A batch compile on 3 threads: every program right, the cache filled by
 * concurrent writers (the same program twice: two writers of one entry),
 * then a batch of hits in a new runtime. */
static void test_batch_compile(void** state) {
  (void)state;
  char* dir = tu_tmpdir("batch");
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cache_dir = dir;
  o.cpu_devices = 1;
  o.compile_threads = 3;
  int n = g_tp.count + 1;
  st_program_compile_job* jobs = calloc((size_t)n, sizeof(*jobs));
  for (int round = 0; round < 2; ++round) {
    st_runtime* rt = NULL;
    ASSERT_OK(st_runtime_create(&o, &rt));
    assert_int_equal(st_runtime_compile_threads(rt), 3);
    for (int i = 0; i < g_tp.count; ++i) jobs[i] = (st_program_compile_job){.path = g_tp.progs[i].file};
    jobs[g_tp.count] = (st_program_compile_job){.path = prog("matmul")->file};
    ASSERT_OK(st_program_compile_files(rt, jobs, n));
    st_runtime_stats rs;
    st_runtime_get_stats(rt, &rs);
    /* The duplicate may find its twin's entry already stored. */
    assert_int_equal(rs.compiles + rs.cache_hits, n);
    if (round == 1) assert_int_equal(rs.compiles, 0);
    for (int i = 0; i < n; ++i) {
      assert_non_null(jobs[i].program);
      assert_true(jobs[i].seconds > 0);
      run_check_on(rt, jobs[i].program, i < g_tp.count ? &g_tp.progs[i] : prog("matmul"), 0);
      st_program_destroy(jobs[i].program);
    }
    st_runtime_destroy(rt);
  }
  /* One entry per distinct program, no temporary left by the racing writers. */
  assert_int_equal(count_entries(dir), g_tp.count);
  DIR* d = opendir(dir);
  struct dirent* e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp")) fail_msg("temporary file left behind: %s", e->d_name);
  closedir(d);
  free(jobs);
  tu_rmtree(dir);
  free(dir);
}

/* All or nothing, and the error is the first failing job's, whatever order
 * the threads finish in. */
static void test_batch_compile_errors(void** state) {
  (void)state;
  char* dir = tu_tmpdir("batch_err");
  char bad[1200];
  snprintf(bad, sizeof(bad), "%s/bad.mlir", dir);
  const char* text = "func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xf32> { return %nope : tensor<2xf32> }";
  assert_int_equal(tu_write_file(bad, text, strlen(text)), 0);
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cpu_devices = 1;
  o.compile_threads = 4;
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&o, &rt));
  for (int rep = 0; rep < 3; ++rep) {
    st_program_compile_job jobs[5] = {
        {.path = prog("matmul")->file}, {.path = bad}, {.path = prog("reduction")->file},
        {.path = "/nonexistent/strata/missing.mlir"}, {.path = prog("matmul")->file}};
    st_status s = st_program_compile_files(rt, jobs, 5);
    assert_non_null(s);
    if (!strstr(st_status_message(s), "bad.mlir")) fail_msg("error does not name the first failing job: %s", st_status_message(s));
    st_status_free(s);
    for (int i = 0; i < 5; ++i) assert_null(jobs[i].program);
  }
  /* An empty batch is fine; a negative count is a caller bug. */
  ASSERT_OK(st_program_compile_files(rt, NULL, 0));
  st_status s = st_program_compile_files(rt, NULL, -1);
  assert_non_null(s);
  st_status_free(s);
  st_runtime_destroy(rt);

  o.compile_threads = -1;
  s = st_runtime_create(&o, &rt);
  assert_non_null(s);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  assert_non_null(strstr(st_status_message(s), "runtime.compile_threads=-1"));
  st_status_free(s);
  tu_rmtree(dir);
  free(dir);
}

static int group_setup(void** state) {
  (void)state;
  return tu_testprogs_make(&g_tp);
}

static int group_teardown(void** state) {
  (void)state;
  tu_testprogs_free(&g_tp);
  return 0;
}


/* st_program_from_cache: false for XLA's compile, true for a cache load. */
static void test_program_from_cache(void** state) {
  (void)state;
  char dir[] = "/tmp/strata_fromcache_XXXXXX";
  assert_non_null(mkdtemp(dir));
  const tu_prog* p = prog("matmul");
  for (int round = 0; round < 2; ++round) {
    st_runtime* rt = make_runtime(dir, NULL, 0, false, 1);
    st_program* prg = NULL;
    ASSERT_OK(st_program_compile_file(rt, p->file, NULL, &prg));
    assert_int_equal(st_program_from_cache(prg), round == 1);
    st_program_destroy(prg);
    st_runtime_destroy(rt);
  }
  assert_false(st_program_from_cache(NULL));
  tu_rmtree(dir);
}

static bool has_bytes(const uint8_t* hay, size_t n, const char* needle) {
  size_t k = strlen(needle);
  for (size_t i = 0; i + k <= n; ++i)
    if (!memcmp(hay + i, needle, k)) return true;
  return false;
}

/* A GPU plugin's compile defaults (st__gpu_compile_defaults): a GPU
 * cannot run here, so the real CPU runtime's platform name is set to
 * "cuda" by hand for the call (a mock of the platform, nothing else); the
 * CPU runtime itself must keep its options byte for byte. */
static void test_gpu_autotune_defaults(void** state) {
  (void)state;
  char dir[] = "/tmp/strata_autotune_XXXXXX";
  assert_non_null(mkdtemp(dir));
  st_runtime* rt = make_runtime(dir, NULL, 0, false, 1);
  st_runtime_info info;
  st_runtime_get_info(rt, &info);
  assert_string_equal(info.autotune_cache_dir, ""); /* cpu: none */
  assert_false(has_bytes(rt->compile_options, rt->compile_options_size, "autotune"));
  assert_true(st_runtime_compile_threads(rt) >= 1);

  char* cpu = rt->platform_name;
  rt->platform_name = "cuda";
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cache_dir = dir;
  ASSERT_OK(st__gpu_compile_defaults(rt, &o));
  char want[512];
  snprintf(want, sizeof(want), "%s/xla_autotune", dir);
  st_runtime_get_info(rt, &info);
  assert_string_equal(info.autotune_cache_dir, want);
  assert_true(has_bytes(rt->compile_options, rt->compile_options_size, "xla_gpu_per_fusion_autotune_cache_dir"));
  assert_true(has_bytes(rt->compile_options, rt->compile_options_size, want));
  struct stat st;
  assert_int_equal(stat(want, &st), 0);
  assert_int_equal(st_runtime_compile_threads(rt), 1); /* runtime.compile_threads=0 on a GPU */

  /* The user's directory wins and the options are theirs. */
  const char* mine[] = {"xla_gpu_per_fusion_autotune_cache_dir=/somewhere/else"};
  o.xla_options = mine;
  o.xla_option_count = 1;
  free(rt->autotune_dir);
  rt->autotune_dir = NULL;
  size_t before = rt->compile_options_size;
  ASSERT_OK(st__gpu_compile_defaults(rt, &o));
  st_runtime_get_info(rt, &info);
  assert_string_equal(info.autotune_cache_dir, "/somewhere/else");
  assert_int_equal(rt->compile_options_size, before);
  rt->platform_name = cpu;
  st_runtime_destroy(rt);
  tu_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_hit),
      cmocka_unit_test(test_cache_option_change_misses),
      cmocka_unit_test(test_cache_corrupt_entries),
      cmocka_unit_test(test_deterministic_repeatable),
      cmocka_unit_test(test_batch_compile),
      cmocka_unit_test(test_batch_compile_errors),
      cmocka_unit_test(test_program_from_cache),
      cmocka_unit_test(test_gpu_autotune_defaults),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
