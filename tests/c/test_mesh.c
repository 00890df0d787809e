/* test_mesh.c — SPMD programs over several CPU devices (strata/mesh.h):
 * the collective programs strata_jax.parallel exports (all_gather,
 * reduce_scatter, all_reduce over meshes of 2 and 4 devices) compile with
 * strata's own compile options and run with one argument list per device;
 * every device's output is checked against the collective computed here by
 * hand from distinct per-device inputs. Also: a mesh on devices in another
 * order, sharded tensors round-tripping through the collectives, per-device
 * events, the executable cache, and the errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/rt_internal.h"
#include "strata/mesh.h"
#include "strata/runtime.h"
#include "test_util.h"

/*--- the exported programs (spmd_index.txt) -----------------------------------*/

#define MAX_PROGS 32
#define MAX_T 4

typedef struct {
  char name[64];
  char file[1024];
  char kind[64];
  char axis[64];
  int mesh[3]; /* data, fsdp, tensor */
  int n_in, n_out;
  st_tensor_type in[MAX_T], out[MAX_T]; /* per device */
  st_tensor_type logical[MAX_T];        /* the tensor's own shape */
} sprog;

static char* g_dir;
static sprog g_progs[MAX_PROGS];
static int g_count;
static st_runtime* g_rt; /* 4 CPU devices */
static const char* const kAxes[3] = {"data", "fsdp", "tensor"};

static int export_programs(void) {
  g_dir = tu_tmpdir("spmd");
  if (!g_dir) return -1;
  char cmd[2048];
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && XLA_FLAGS=--xla_force_host_platform_device_count=4 PYTHONPATH='%s/python' JAX_PLATFORMS=cpu "
           "'%s/.venv/bin/python' -m strata_jax.parallel '%s' >'%s/export.log' 2>&1",
           STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, g_dir, g_dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "spmd programs: exporter failed, see %s/export.log\n", g_dir);
    return -1;
  }
  char path[1200];
  snprintf(path, sizeof(path), "%s/spmd_index.txt", g_dir);
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  while (fgets(line, sizeof(line), f)) {
    char kind[16], name[64], a[256], b[64], c[64], d[64], e[16], g[16], h[16];
    int n = sscanf(line, "%15s %63s %255s %63s %63s %63s %15s %15s", kind, name, a, b, c, d, e, g);
    (void)h;
    if (n == 8 && !strcmp(kind, "program")) {
      if (g_count >= MAX_PROGS) break;
      sprog* p = &g_progs[g_count++];
      snprintf(p->name, sizeof(p->name), "%s", name);
      snprintf(p->file, sizeof(p->file), "%s/%s", g_dir, a);
      snprintf(p->kind, sizeof(p->kind), "%s", b);
      snprintf(p->axis, sizeof(p->axis), "%s", c);
      p->mesh[0] = atoi(d);
      p->mesh[1] = atoi(e);
      p->mesh[2] = atoi(g);
    } else if (n == 6 && (!strcmp(kind, "in") || !strcmp(kind, "out"))) {
      sprog* p = g_count > 0 && !strcmp(g_progs[g_count - 1].name, name) ? &g_progs[g_count - 1] : NULL;
      int idx = atoi(a);
      if (!p || idx < 0 || idx >= MAX_T) continue;
      st_tensor_type* t = kind[0] == 'i' ? &p->in[idx] : &p->out[idx];
      t->dtype = st_dtype_parse(b);
      if (tu__parse_dims(c, t) != 0) return -1;
      p->logical[idx].dtype = t->dtype;
      if (tu__parse_dims(d, &p->logical[idx]) != 0) return -1;
      if (kind[0] == 'i' && idx + 1 > p->n_in) p->n_in = idx + 1;
      if (kind[0] == 'o' && idx + 1 > p->n_out) p->n_out = idx + 1;
    }
  }
  fclose(f);
  return g_count > 0 ? 0 : -1;
}

static const sprog* sp(const char* name) {
  for (int i = 0; i < g_count; ++i)
    if (!strcmp(g_progs[i].name, name)) return &g_progs[i];
  fail_msg("SPMD program %s missing from the index", name);
  return NULL;
}

static st_mesh mesh_of(const sprog* p, const int* devices) {
  st_mesh m;
  ASSERT_OK(st_mesh_make(3, kAxes, p->mesh, devices, &m));
  return m;
}

static st_program* compile_sp(const sprog* p, const st_mesh* m) {
  st_program_signature sig = {.input_count = p->n_in, .inputs = p->in, .output_count = p->n_out, .outputs = p->out};
  st_program* prog = NULL;
  ASSERT_OK(st_program_compile_spmd_file(g_rt, p->file, m, &sig, &prog));
  return prog;
}

/* Distinct per device, tensor and element; small integers, so every sum
 * below is exact in f32. */
static float input_value(int part, int tensor, int64_t e) { return (float)(1000 * (part + 1) + 100 * tensor + e); }

/* The partitions that talk to |p| along |axis|, ordered by their coordinate
 * on it (the mesh is row-major, so the member with coordinate c is p moved
 * by c - coord(p) strides). */
static int group_of(const st_mesh* m, int axis, int p, int* out) {
  int stride = 1;
  for (int a = m->axis_count - 1; a > axis; --a) stride *= m->axis_sizes[a];
  int c = st_mesh_coord(m, p, axis);
  for (int k = 0; k < m->axis_sizes[axis]; ++k) out[k] = p + (k - c) * stride;
  return m->axis_sizes[axis];
}

/* What partition |p|'s output |t| must be, from the definition of the
 * collective and the inputs of input_value(). */
static void expected(const sprog* sp, const st_mesh* m, int p, int t, float* want) {
  int axis = st_mesh_axis(m, sp->axis);
  int group[ST_MESH_MAX_DEVICES];
  int n = group_of(m, axis, p, group);
  const st_tensor_type* lt = &sp->logical[t];
  int64_t row = 1;
  for (int d = 1; d < lt->rank; ++d) row *= lt->dims[d];
  int64_t d0 = lt->dims[0];
  int64_t rows = (d0 + n - 1) / n; /* per shard, padded */
  if (!strcmp(sp->kind, "all_reduce")) {
    for (int64_t e = 0; e < d0 * row; ++e) {
      float s = 0;
      for (int k = 0; k < n; ++k) s += input_value(group[k], t, e);
      want[e] = s;
    }
  } else if (!strcmp(sp->kind, "reduce_scatter")) {
    int r = st_mesh_coord(m, p, axis);
    for (int64_t e = 0; e < rows * row; ++e) {
      int64_t ge = r * rows * row + e; /* element of the padded full tensor */
      float s = 0;
      if (ge < d0 * row)
        for (int k = 0; k < n; ++k) s += input_value(group[k], t, ge);
      want[e] = s;
    }
  } else { /* all_gather: shard k (rows*row elements) comes from group[k] */
    for (int64_t e = 0; e < d0 * row; ++e) {
      int64_t k = e / (rows * row);
      want[e] = input_value(group[k], t, e % (rows * row));
    }
  }
}

/* Runs |p| on mesh |m| with input_value() inputs and checks every device's
 * every output. */
static void run_and_check(const sprog* p, const st_mesh* m) {
  st_program* prog = compile_sp(p, m);
  int n = m->device_count;
  assert_int_equal(st_program_device_count(prog), n);
  for (int part = 0; part < n; ++part) assert_int_equal(st_program_partition_device(prog, part), m->devices[part]);
  st_buffer** in = calloc((size_t)(n * p->n_in), sizeof(*in));
  st_buffer** out = calloc((size_t)(n * p->n_out), sizeof(*out));
  st_event** done = calloc((size_t)n, sizeof(*done));
  for (int part = 0; part < n; ++part)
    for (int i = 0; i < p->n_in; ++i) {
      int64_t cnt = st_tensor_type_elements(&p->in[i]);
      float* v = malloc((size_t)cnt * sizeof(float));
      for (int64_t e = 0; e < cnt; ++e) v[e] = input_value(part, i, e);
      ASSERT_OK(st_buffer_from_host(g_rt, m->devices[part], &p->in[i], v, &in[part * p->n_in + i]));
      free(v);
    }
  ASSERT_OK(st_program_execute_spmd(prog, in, p->n_in, out, p->n_out, done));
  for (int part = 0; part < n; ++part) {
    assert_non_null(done[part]);
    ASSERT_OK(st_event_await(done[part]));
    st_event_destroy(done[part]);
  }
  for (int part = 0; part < n; ++part)
    for (int i = 0; i < p->n_out; ++i) {
      st_buffer* b = out[part * p->n_out + i];
      assert_int_equal(st_buffer_device(b), m->devices[part]);
      char got_t[96], want_t[96];
      st_tensor_type_format(st_buffer_type(b), got_t, sizeof(got_t));
      st_tensor_type_format(&p->out[i], want_t, sizeof(want_t));
      if (strcmp(got_t, want_t))
        fail_msg("%s partition %d output %d: type %s, want %s", p->name, part, i, got_t, want_t);
      int64_t cnt = st_tensor_type_elements(&p->out[i]);
      float* got = malloc((size_t)cnt * sizeof(float));
      float* want = malloc((size_t)cnt * sizeof(float));
      ASSERT_OK(st_buffer_to_host(b, got, (size_t)cnt * sizeof(float)));
      expected(p, m, part, i, want);
      for (int64_t e = 0; e < cnt; ++e)
        if (got[e] != want[e])
          fail_msg("%s (mesh devices %d..): partition %d output %d element %lld: got %.1f, want %.1f", p->name,
                   m->devices[0], part, i, (long long)e, got[e], want[e]);
      free(got);
      free(want);
    }
  for (int i = 0; i < n * p->n_in; ++i) st_buffer_destroy(in[i]);
  for (int i = 0; i < n * p->n_out; ++i) st_buffer_destroy(out[i]);
  free(in);
  free(out);
  free(done);
  st_program_destroy(prog);
}

/*--- tests ----------------------------------------------------------------------*/

/* The SPMD compile options, byte for byte: the build options JAX's own
 * get_compile_options writes for the same counts and assignment (checked
 * with jaxlib when this was written), then the base options' XLA
 * overrides unchanged, and no portable flag. */
static void test_spmd_compile_options(void** state) {
  (void)state;
  const char* const xla[] = {"xla_b=1", "xla_a=true"};
  uint8_t* base = NULL;
  size_t base_n = 0;
  ASSERT_OK(st__compile_options_build(xla, 2, false, &base, &base_n));
  const int64_t ids[2] = {2, 3};
  uint8_t* got = NULL;
  size_t n = 0;
  ASSERT_OK(st__compile_options_spmd(base, base_n, ids, 2, &got, &n));
  static const uint8_t build[] = {
      0x1a, 0x24,                                                       /* 3: executable_build_options */
      0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, /* device_ordinal -1 */
      0x20, 0x01,                                                       /* num_replicas 1 */
      0x28, 0x02,                                                       /* num_partitions 2 */
      0x30, 0x01,                                                       /* use_spmd_partitioning */
      0x4a, 0x0e, 0x08, 0x01, 0x10, 0x02,                               /* device_assignment 1 x 2 */
      0x1a, 0x03, 0x0a, 0x01, 0x02,                                     /*   partition 0: device 2 */
      0x1a, 0x03, 0x0a, 0x01, 0x03,                                     /*   partition 1: device 3 */
      0x98, 0x01, 0x01,                                                 /* use_shardy_partitioner */
  };
  /* The overrides: everything in base after its field 3 and field 4. */
  size_t skip = 2 + base[1] + 2;
  assert_int_equal(base[0], 0x1a);
  assert_int_equal(base[2 + base[1]], 0x20); /* base's portable flag */
  assert_int_equal(n, sizeof(build) + (base_n - skip));
  assert_memory_equal(got, build, sizeof(build));
  assert_memory_equal(got + sizeof(build), base + skip, base_n - skip);
  free(got);
  /* A damaged base (a length running past the end) is an error, not a read
   * past the buffer. */
  uint8_t bad[] = {0x3a, 0x7f, 0x00};
  ASSERT_ERROR(st__compile_options_spmd(bad, sizeof(bad), ids, 2, &got, &n), ST_CODE_INTERNAL, "at byte 0");
  assert_null(got);
  free(base);
}

static void test_mesh_make(void** state) {
  (void)state;
  st_mesh m;
  const int sizes[3] = {2, 2, 1};
  ASSERT_OK(st_mesh_make(3, kAxes, sizes, NULL, &m));
  assert_int_equal(m.device_count, 4);
  assert_int_equal(st_mesh_axis(&m, "fsdp"), 1);
  assert_int_equal(st_mesh_axis(&m, "pipeline"), -1);
  /* Row-major, the last axis fastest: index 2 is data=1, fsdp=0. */
  assert_int_equal(st_mesh_coord(&m, 2, 0), 1);
  assert_int_equal(st_mesh_coord(&m, 2, 1), 0);
  assert_int_equal(st_mesh_coord(&m, 3, 1), 1);
  const int bad_sizes[3] = {2, 0, 1};
  ASSERT_ERROR(st_mesh_make(3, kAxes, bad_sizes, NULL, &m), ST_CODE_CONFIG, "axis 'fsdp' has size 0");
  const int dup[4] = {0, 1, 1, 3};
  ASSERT_ERROR(st_mesh_make(3, kAxes, sizes, dup, &m), ST_CODE_CONFIG, "device 1 appears twice");
  const char* const twice[2] = {"data", "data"};
  ASSERT_ERROR(st_mesh_make(2, twice, sizes, NULL, &m), ST_CODE_CONFIG, "axis 'data' appears twice");
}

/* Every exported collective, on devices 0..n-1, every device checked. */
static void test_collectives_by_hand(void** state) {
  (void)state;
  int ran = 0;
  for (int i = 0; i < g_count; ++i) {
    st_mesh m = mesh_of(&g_progs[i], NULL);
    run_and_check(&g_progs[i], &m);
    ++ran;
  }
  /* 6 (mesh, axis) cases x 3 kinds, and a donating all_reduce: a shorter
   * index would hide programs. */
  assert_int_equal(ran, 19);
}

/* The same programs on other devices: a 2-device mesh on devices 2 and 3,
 * and a 4-device mesh in reverse order (partition p on device 3 - p), so a
 * wrong device assignment or argument-list order shows up. */
static void test_other_devices(void** state) {
  (void)state;
  const int upper[2] = {2, 3};
  const int reversed[4] = {3, 2, 1, 0};
  const char* two[] = {"fsdp2_all_gather", "fsdp2_reduce_scatter", "data2_all_reduce"};
  for (int i = 0; i < 3; ++i) {
    st_mesh m = mesh_of(sp(two[i]), upper);
    run_and_check(sp(two[i]), &m);
  }
  const char* four[] = {"fsdp4_all_gather", "fsdp4_reduce_scatter", "d2f2_data_all_reduce", "d2f2_fsdp_reduce_scatter"};
  for (int i = 0; i < 4; ++i) {
    st_mesh m = mesh_of(sp(four[i]), reversed);
    run_and_check(sp(four[i]), &m);
  }
}

/* A parameter sharded over fsdp (from the host) gathers to the whole value
 * on every device; a gradient given as partial sums reduce-scatters to the
 * sharded sum; both read back through st_sharded_to_host. */
static void test_sharded_round_trip(void** state) {
  (void)state;
  const sprog* ag = sp("fsdp4_all_gather");
  const sprog* rs = sp("fsdp4_reduce_scatter");
  st_mesh m = mesh_of(ag, NULL);
  st_program* pag = compile_sp(ag, &m);
  st_program* prs = compile_sp(rs, &m);
  const uint32_t fsdp = 1u << 1;
  st_sharding split0 = {.split = {fsdp}};
  st_sharding repl;
  memset(&repl, 0, sizeof(repl));
  st_sharding partial = {.partial = fsdp};

  st_sharded* params[2] = {NULL, NULL};
  float* host[2];
  for (int t = 0; t < 2; ++t) {
    const st_tensor_type* g = &ag->logical[t];
    int64_t cnt = st_tensor_type_elements(g);
    host[t] = malloc((size_t)cnt * sizeof(float));
    for (int64_t e = 0; e < cnt; ++e) host[t][e] = 0.25f * (float)e - (float)t;
    ASSERT_OK(st_sharded_from_host(g_rt, &m, g, &split0, host[t], &params[t]));
    /* 6 rows over 4 devices: 2 rows each, the last shard all padding. */
    assert_int_equal(st_sharded_local_type(params[t])->dims[0], 2);
    char lt[64], wt[64];
    st_tensor_type_format(st_sharded_local_type(params[t]), lt, sizeof(lt));
    st_tensor_type_format(&ag->in[t], wt, sizeof(wt));
    assert_string_equal(lt, wt);
  }
  st_sharded* full[2] = {NULL, NULL};
  st_tensor_type gtypes[2] = {ag->logical[0], ag->logical[1]};
  st_sharding out_sh[2] = {repl, repl};
  st_event* done[4] = {NULL};
  ASSERT_OK(st_program_execute_sharded(pag, params, 2, gtypes, out_sh, full, 2, done));
  for (int p = 0; p < 4; ++p) {
    ASSERT_OK(st_event_await(done[p]));
    st_event_destroy(done[p]);
  }
  for (int t = 0; t < 2; ++t) {
    int64_t cnt = st_tensor_type_elements(&gtypes[t]);
    float* got = malloc((size_t)cnt * sizeof(float));
    /* Every device holds the whole value, not only the one to_host reads. */
    for (int p = 0; p < 4; ++p) {
      ASSERT_OK(st_buffer_to_host(st_sharded_shard(full[t], p), got, (size_t)cnt * sizeof(float)));
      for (int64_t e = 0; e < cnt; ++e)
        if (got[e] != host[t][e])
          fail_msg("gather: tensor %d device %d element %lld: %g vs %g", t, p, (long long)e, got[e], host[t][e]);
    }
    free(got);
  }
  /* reduce_scatter of partial sums: from_host puts the value on fsdp
   * coordinate 0 and zeros elsewhere, so the sum is the value itself. */
  st_sharded* grads[2] = {NULL, NULL};
  for (int t = 0; t < 2; ++t) ASSERT_OK(st_sharded_from_host(g_rt, &m, &rs->logical[t], &partial, host[t], &grads[t]));
  /* a partial tensor reads back as the sum of its shards */
  {
    int64_t cnt = st_tensor_type_elements(&rs->logical[0]);
    float* got = malloc((size_t)cnt * sizeof(float));
    ASSERT_OK(st_sharded_to_host(grads[0], got, (size_t)cnt * sizeof(float)));
    assert_memory_equal(got, host[0], (size_t)cnt * sizeof(float));
    free(got);
  }
  st_sharded* red[2] = {NULL, NULL};
  st_sharding split_sh[2] = {split0, split0};
  ASSERT_OK(st_program_execute_sharded(prs, grads, 2, gtypes, split_sh, red, 2, NULL));
  for (int t = 0; t < 2; ++t) {
    int64_t cnt = st_tensor_type_elements(&gtypes[t]);
    float* got = malloc((size_t)cnt * sizeof(float));
    ASSERT_OK(st_sharded_to_host(red[t], got, (size_t)cnt * sizeof(float)));
    for (int64_t e = 0; e < cnt; ++e)
      if (got[e] != host[t][e])
        fail_msg("reduce_scatter: tensor %d element %lld: %g vs %g", t, (long long)e, got[e], host[t][e]);
    free(got);
    assert_int_equal(st_sharded_bytes_per_device(red[t]), st_tensor_type_bytes(&rs->out[t]));
  }
  /* Output shardings that do not match the program's shards are refused
   * (the manifest entry, not the caller, says what a program produces). */
  st_sharded* wrong[2] = {NULL, NULL};
  ASSERT_ERROR(st_program_execute_sharded(prs, grads, 2, gtypes, out_sh, wrong, 2, NULL), ST_CODE_RUNTIME,
               "output 0", "the sharding gives f32[6,3]");
  assert_null(wrong[0]);
  for (int t = 0; t < 2; ++t) {
    st_sharded_destroy(params[t]);
    st_sharded_destroy(full[t]);
    st_sharded_destroy(grads[t]);
    st_sharded_destroy(red[t]);
    free(host[t]);
  }
  st_program_destroy(pag);
  st_program_destroy(prs);
}

static void test_sharding_layout(void** state) {
  (void)state;
  const int sizes[3] = {2, 2, 1};
  st_mesh m;
  ASSERT_OK(st_mesh_make(3, kAxes, sizes, NULL, &m));
  /* f32[5,4]: rows split over fsdp (3 per shard, padded), columns over data. */
  st_tensor_type g = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {5, 4}};
  st_sharding sh = {.split = {1u << 1, 1u << 0}};
  st_tensor_type l;
  ASSERT_OK(st_sharding_local_type(&m, &g, &sh, &l));
  assert_int_equal(l.dims[0], 3);
  assert_int_equal(l.dims[1], 2);
  float v[20];
  for (int i = 0; i < 20; ++i) v[i] = (float)i + 1;
  st_sharded* t = NULL;
  ASSERT_OK(st_sharded_from_host(g_rt, &m, &g, &sh, v, &t));
  /* mesh index 3 = data 1, fsdp 1: rows 3..4 (+1 padding row), columns 2..3 */
  float shard[6];
  ASSERT_OK(st_buffer_to_host(st_sharded_shard(t, 3), shard, sizeof(shard)));
  const float want3[6] = {15, 16, 19, 20, 0, 0};
  assert_memory_equal(shard, want3, sizeof(shard));
  /* mesh index 1 = data 0, fsdp 1: rows 3..4, columns 0..1 */
  ASSERT_OK(st_buffer_to_host(st_sharded_shard(t, 1), shard, sizeof(shard)));
  const float want1[6] = {13, 14, 17, 18, 0, 0};
  assert_memory_equal(shard, want1, sizeof(shard));
  float back[20];
  ASSERT_OK(st_sharded_to_host(t, back, sizeof(back)));
  assert_memory_equal(back, v, sizeof(v));
  st_sharded_destroy(t);
  /* An empty tensor has empty shards and round-trips (it once looped
   * forever walking its rows). */
  st_tensor_type empty = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {0, 3}};
  st_sharding rows = {.split = {1u << 1}};
  float none[1] = {0};
  ASSERT_OK(st_sharded_from_host(g_rt, &m, &empty, &rows, none, &t));
  assert_int_equal(st_sharded_bytes_per_device(t), 0);
  ASSERT_OK(st_sharded_to_host(t, none, 0));
  st_sharded_destroy(t);
  /* An axis used twice is refused. */
  st_sharding twice = {.split = {1u << 1, 1u << 1}};
  ASSERT_ERROR(st_sharding_local_type(&m, &g, &twice, &l), ST_CODE_INTERNAL, "dimension 1 reuses a mesh axis");
  st_sharding rank = {.split = {0, 0, 1u}};
  ASSERT_ERROR(st_sharding_local_type(&m, &g, &rank, &l), ST_CODE_INTERNAL, "dimension 2 is split");
}

/* FSDP of a tensor-parallel block (st_sharding.outer): dim 0 of f32[6,2]
 * is cut over tensor first (two blocks of 3 rows), then each block over
 * fsdp (2 rows per shard, the second padded), on the mesh fsdp=2 x tensor=2
 * (mesh index p = fsdp * 2 + tensor). This is the layout the fsdp
 * collectives give a row-parallel weight under fsdp x tensor. */
static void test_sharding_outer(void** state) {
  (void)state;
  const int sizes[3] = {1, 2, 2};
  st_mesh m;
  ASSERT_OK(st_mesh_make(3, kAxes, sizes, NULL, &m));
  st_tensor_type g = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {6, 2}};
  st_sharding sh = {.split = {(1u << 1) | (1u << 2)}, .outer = {1u << 2}};
  st_tensor_type l;
  ASSERT_OK(st_sharding_local_type(&m, &g, &sh, &l));
  assert_int_equal(l.dims[0], 2);
  assert_int_equal(l.dims[1], 2);
  float v[12];
  for (int i = 0; i < 12; ++i) v[i] = (float)i + 1;
  st_sharded* t = NULL;
  ASSERT_OK(st_sharded_from_host(g_rt, &m, &g, &sh, v, &t));
  /* tensor 1's block is rows 3..5; fsdp 0 takes rows 3..4, fsdp 1 row 5 and a zero row */
  const float want[4][4] = {{1, 2, 3, 4}, {7, 8, 9, 10}, {5, 6, 0, 0}, {11, 12, 0, 0}};
  for (int p = 0; p < 4; ++p) {
    float shard[4];
    ASSERT_OK(st_buffer_to_host(st_sharded_shard(t, p), shard, sizeof(shard)));
    assert_memory_equal(shard, want[p], sizeof(shard));
  }
  float back[12];
  ASSERT_OK(st_sharded_to_host(t, back, sizeof(back)));
  assert_memory_equal(back, v, sizeof(v));
  st_sharded_destroy(t);
  /* The outer cut must divide, and be among the split axes. */
  st_tensor_type odd = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {5, 2}};
  ASSERT_ERROR(st_sharding_local_type(&m, &odd, &sh, &l), ST_CODE_INTERNAL, "does not divide in 2 outer blocks");
  st_sharding stray = {.split = {1u << 1}, .outer = {1u << 2}};
  ASSERT_ERROR(st_sharding_local_type(&m, &g, &stray, &l), ST_CODE_INTERNAL, "outer axes are not among its split axes");
}

/* One-device (portable) launches and an SPMD collective share buffers in
 * both directions, with no host wait in between: x[p] = 2 h[p] on each
 * device, y = all_reduce over data of x, z[p] = 2 y[p] on each device. PJRT
 * orders each launch after its inputs' producers, across the two kinds. */
static void test_mixed_with_one_device_programs(void** state) {
  (void)state;
  static const char kDouble[] =
      "module @double {\n"
      "  func.func public @main(%arg0: tensor<6x3xf32>, %arg1: tensor<5xf32>) -> (tensor<6x3xf32>, tensor<5xf32>) {\n"
      "    %0 = stablehlo.add %arg0, %arg0 : tensor<6x3xf32>\n"
      "    %1 = stablehlo.add %arg1, %arg1 : tensor<5xf32>\n"
      "    return %0, %1 : tensor<6x3xf32>, tensor<5xf32>\n"
      "  }\n"
      "}\n";
  st_program* dbl = NULL;
  ASSERT_OK(st_program_compile(g_rt, "double", kDouble, sizeof(kDouble) - 1, NULL, &dbl));
  const sprog* p = sp("d2f2_data_all_reduce");
  st_mesh m = mesh_of(p, NULL);
  st_program* ar = compile_sp(p, &m);
  enum { N = 4 };
  st_buffer *h[N][2], *x[N * 2], *y[N * 2], *z[N][2];
  for (int d = 0; d < N; ++d)
    for (int i = 0; i < 2; ++i) {
      int64_t cnt = st_tensor_type_elements(&p->in[i]);
      float* v = malloc((size_t)cnt * sizeof(float));
      for (int64_t e = 0; e < cnt; ++e) v[e] = input_value(d, i, e);
      ASSERT_OK(st_buffer_from_host(g_rt, d, &p->in[i], v, &h[d][i]));
      free(v);
    }
  for (int d = 0; d < N; ++d) ASSERT_OK(st_program_execute(dbl, d, h[d], 2, &x[d * 2], 2, NULL));
  ASSERT_OK(st_program_execute_spmd(ar, x, 2, y, 2, NULL));
  for (int d = 0; d < N; ++d) ASSERT_OK(st_program_execute(dbl, d, &y[d * 2], 2, z[d], 2, NULL));
  for (int d = 0; d < N; ++d)
    for (int i = 0; i < 2; ++i) {
      int64_t cnt = st_tensor_type_elements(&p->out[i]);
      float* got = malloc((size_t)cnt * sizeof(float));
      float* want = malloc((size_t)cnt * sizeof(float));
      ASSERT_OK(st_buffer_to_host(z[d][i], got, (size_t)cnt * sizeof(float)));
      expected(p, &m, d, i, want);
      for (int64_t e = 0; e < cnt; ++e)
        if (got[e] != 4 * want[e])
          fail_msg("device %d output %d element %lld: got %.1f, want %.1f", d, i, (long long)e, got[e], 4 * want[e]);
      free(got);
      free(want);
    }
  for (int d = 0; d < N; ++d)
    for (int i = 0; i < 2; ++i) {
      st_buffer_destroy(h[d][i]);
      st_buffer_destroy(x[d * 2 + i]);
      st_buffer_destroy(y[d * 2 + i]);
      st_buffer_destroy(z[d][i]);
    }
  st_program_destroy(ar);
  st_program_destroy(dbl);
}

/* A donating collective consumes its inputs on every device; the outputs
 * are right and a second launch with the same inputs is refused, naming the
 * partition and the program that consumed them. */
static void test_donation(void** state) {
  (void)state;
  const sprog* p = sp("data2_all_reduce_donated");
  st_mesh m = mesh_of(p, NULL);
  st_program* prog = compile_sp(p, &m);
  for (int i = 0; i < p->n_in; ++i) assert_true(st_program_input_donated(prog, i));
  st_buffer* in[4];
  st_buffer* out[4];
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < 2; ++i) {
      int64_t cnt = st_tensor_type_elements(&p->in[i]);
      float* v = malloc((size_t)cnt * sizeof(float));
      for (int64_t e = 0; e < cnt; ++e) v[e] = input_value(d, i, e);
      ASSERT_OK(st_buffer_from_host(g_rt, d, &p->in[i], v, &in[d * 2 + i]));
      free(v);
    }
  ASSERT_OK(st_program_execute_spmd(prog, in, 2, out, 2, NULL));
  for (int k = 0; k < 4; ++k) assert_true(st_buffer_is_consumed(in[k]));
  float got[18], want[18];
  for (int d = 0; d < 2; ++d) {
    ASSERT_OK(st_buffer_to_host(out[d * 2], got, sizeof(got)));
    expected(p, &m, d, 0, want);
    assert_memory_equal(got, want, sizeof(got));
  }
  st_buffer* again[4];
  ASSERT_ERROR(st_program_execute_spmd(prog, in, 2, again, 2, NULL), ST_CODE_RUNTIME, "partition 0", "input 0",
               "was consumed (donated to program", "data2_all_reduce_donated");
  for (int k = 0; k < 4; ++k) {
    st_buffer_destroy(in[k]);
    st_buffer_destroy(out[k]);
  }
  st_program_destroy(prog);
}

static void test_errors(void** state) {
  (void)state;
  const sprog* p = sp("fsdp2_all_reduce");
  st_mesh m = mesh_of(p, NULL);
  st_program* prog = compile_sp(p, &m);
  st_buffer* in[4] = {NULL};
  float v[18] = {0};
  /* partition 1's inputs on device 0 */
  for (int i = 0; i < 4; ++i) ASSERT_OK(st_buffer_from_host(g_rt, 0, &p->in[i % 2], v, &in[i]));
  st_buffer* out[4];
  ASSERT_ERROR(st_program_execute_spmd(prog, in, 2, out, 2, NULL), ST_CODE_RUNTIME, "partition 1", "input 0",
               "on device 0", "runs on device 1");
  /* too little room for the outputs */
  ASSERT_ERROR(st_program_execute_spmd(prog, in, 2, out, 1, NULL), ST_CODE_RUNTIME, "2 outputs per device");
  /* an SPMD program is not a one-device program */
  ASSERT_ERROR(st_program_execute(prog, 0, in, 2, out, 2, NULL), ST_CODE_RUNTIME, "compiled for 2 devices",
               "st_program_execute_spmd");
  for (int i = 0; i < 4; ++i) st_buffer_destroy(in[i]);
  st_program_destroy(prog);

  /* a mesh on a device the runtime lacks */
  const int far[2] = {1, 7};
  st_mesh bad = mesh_of(p, far);
  st_program* none = NULL;
  st_program_signature sig = {.input_count = p->n_in, .inputs = p->in, .output_count = p->n_out, .outputs = p->out};
  ASSERT_ERROR(st_program_compile_spmd_file(g_rt, p->file, &bad, &sig, &none), ST_CODE_RUNTIME, "mesh index 1",
               "device 7", "the runtime has 4 devices");
  assert_null(none);
  /* a program exported for 4 devices compiled for a 2-device mesh */
  const sprog* p4 = sp("fsdp4_all_reduce");
  ASSERT_ERROR(st_program_compile_spmd_file(g_rt, p4->file, &m, NULL, &none), ST_CODE_RUNTIME, p4->file);
  assert_null(none);
}

/* Compiled once, the second compile of the same program for the same mesh
 * comes from the cache and still runs right; another device assignment is
 * another key. */
static void test_cache(void** state) {
  (void)state;
  char* dir = tu_tmpdir("spmd-cache");
  assert_non_null(dir);
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cpu_devices = 4;
  o.cache_dir = dir;
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&o, &rt));
  st_runtime* saved = g_rt;
  g_rt = rt;
  const sprog* p = sp("fsdp2_reduce_scatter");
  st_mesh m = mesh_of(p, NULL);
  const int upper[2] = {2, 3};
  st_mesh m23 = mesh_of(p, upper);
  st_program* a = compile_sp(p, &m);
  st_runtime_stats s;
  st_runtime_get_stats(rt, &s);
  assert_int_equal(s.cache_hits, 0);
  st_program_destroy(a);
  run_and_check(p, &m); /* from the cache */
  st_runtime_get_stats(rt, &s);
  assert_int_equal(s.cache_hits, 1);
  assert_int_equal(s.compiles, 1);
  run_and_check(p, &m23); /* another assignment: compiled */
  st_runtime_get_stats(rt, &s);
  assert_int_equal(s.compiles, 2);
  assert_int_equal(s.cache_hits, 1);
  g_rt = saved;
  st_runtime_destroy(rt);
  tu_rmtree(dir);
  free(dir);
}

static int group_setup(void** state) {
  (void)state;
  if (export_programs() != 0) return -1;
  return tu_runtime_create(4, &g_rt);
}

static int group_teardown(void** state) {
  (void)state;
  st_runtime_destroy(g_rt);
  if (g_dir && !getenv("STRATA_KEEP_TEST_FILES")) tu_rmtree(g_dir);
  free(g_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_spmd_compile_options),
      cmocka_unit_test(test_mesh_make),
      cmocka_unit_test(test_collectives_by_hand),
      cmocka_unit_test(test_other_devices),
      cmocka_unit_test(test_sharded_round_trip),
      cmocka_unit_test(test_sharding_layout),
      cmocka_unit_test(test_sharding_outer),
      cmocka_unit_test(test_mixed_with_one_device_programs),
      cmocka_unit_test(test_donation),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_cache),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
