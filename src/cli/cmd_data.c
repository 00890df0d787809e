/* cmd_data.c — `strata data CONFIG [k=v ...] [--decode IDS | --fill STREAM
 * FIRST COUNT OUT]`: tokenizes the corpus (or validates the token file)
 * and prints the token file, its tokenizer and split sizes (packing
 * none/pack: and each source). The Python reference trainer uses it to
 * read exactly the same tokens. With --decode, it writes the bytes of the
 * ids IDS (comma- or space-separated; "-": read them from stdin) under the
 * corpus's tokenizer to stdout instead (docs/data.md, "Tokenizer"). With
 * --fill, it writes sequences FIRST.. of STREAM (0 train, 1 validation) as
 * st_dataset_fill makes them to the file OUT: inputs, targets (s32),
 * weights (f32), positions (s32), each COUNT*T little-endian values; the
 * test of the Python mirror compares them (docs/data.md, "Packing"). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/train.h"

#define ST__MAX_DECODE_IDS (1u << 24)

/* Parses |text| as ids separated by commas or white space. */
static st_status st__parse_ids(const char* text, int32_t** out_ids, size_t* out_n) {
  *out_ids = NULL;
  *out_n = 0;
  int32_t* ids = NULL;
  size_t n = 0, cap = 0;
  const char* p = text;
  for (;;) {
    while (*p == ',' || isspace((unsigned char)*p)) ++p;
    if (!*p) break;
    char* end = NULL;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',' && !isspace((unsigned char)*end))) {
      free(ids);
      return st_status_make(
          ST_CODE_CONFIG, "--decode: '%.32s' is not a token id (ids are integers >= 0, separated by commas or spaces)",
          p);
    }
    if (n == ST__MAX_DECODE_IDS) {
      free(ids);
      return st_status_make(ST_CODE_CONFIG, "--decode: more than %u ids", ST__MAX_DECODE_IDS);
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 256;
      ids = st_xrealloc(ids, cap * sizeof(int32_t));
    }
    ids[n++] = (int32_t)v;
    p = end;
  }
  *out_ids = ids;
  *out_n = n;
  return ST_OK;
}

static st_status st__data_decode(const st_dataset* ds, const char* arg) {
  char* text = NULL;
  if (!strcmp(arg, "-")) {
    st_strbuf in = {0};
    char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), stdin)) > 0) {
      if (in.len + got > 16u * ST__MAX_DECODE_IDS) {
        st_strbuf_free(&in);
        return st_status_make(ST_CODE_CONFIG, "--decode -: standard input is too long");
      }
      st_strbuf_append_n(&in, buf, got);
    }
    text = st_strbuf_take(&in);
    if (!text) text = st_xstrdup("");
  }
  int32_t* ids = NULL;
  size_t n = 0;
  st_status s = st__parse_ids(text ? text : arg, &ids, &n);
  free(text);
  st_tokenizer* tok = NULL;
  if (!s) s = st_tokenizer_open(st_dataset_token_path(ds), &tok);
  st_strbuf out = {0};
  if (!s) s = st_tokenizer_decode(tok, ids, n, &out);
  if (!s && out.len && fwrite(out.data, 1, out.len, stdout) != out.len)
    s = st_status_make(ST_CODE_IO, "--decode: writing to stdout failed");
  st_strbuf_free(&out);
  st_tokenizer_destroy(tok);
  free(ids);
  return s;
}

/* --fill STREAM FIRST COUNT OUT. */
static st_status st__data_fill(const st_dataset* ds, int64_t T, char** arg) {
  char* end[3];
  long long stream = strtoll(arg[0], &end[0], 10), first = strtoll(arg[1], &end[1], 10),
            count = strtoll(arg[2], &end[2], 10);
  if (*end[0] || *end[1] || *end[2] || (stream != 0 && stream != 1) || first < 0 || count < 1 ||
      count > (1 << 20) / T + 1)
    return st_status_make(ST_CODE_CONFIG, "--fill STREAM FIRST COUNT OUT: STREAM 0 or 1, FIRST >= 0, COUNT from 1 to "
                          "%lld (got '%s %s %s')", (long long)((1 << 20) / T + 1), arg[0], arg[1], arg[2]);
  const size_t n = (size_t)(count * T);
  int32_t* buf = st_xmalloc(4 * n * sizeof(int32_t));
  float* mask = (float*)(buf + 2 * n);
  st_dataset_fill(ds, (int)stream, (uint64_t)first, count, buf, buf + n, mask, buf + 3 * n);
  /* Little-endian on every machine strata runs on (x86-64, aarch64). */
  st_status s = st_fs_write_atomic(arg[3], buf, 4 * n * sizeof(int32_t));
  free(buf);
  return s;
}

static void st__data_print(const st_dataset* ds) {
  printf("%s\ntokens %llu train %llu validation %llu\ntokenizer %s\n", st_dataset_token_path(ds),
         (unsigned long long)st_dataset_token_count(ds), (unsigned long long)st_dataset_split_tokens(ds, 0),
         (unsigned long long)st_dataset_split_tokens(ds, 1), st_dataset_tokenizer_hash(ds));
  if (st_dataset_packing(ds) == ST_DATA_PACKING_CONCAT) return;
  const int n = st_dataset_source_count(ds);
  st_data_source_info* info = st_xcalloc((size_t)n, sizeof(*info));
  st_status s = st_dataset_sources(ds, 0, info);
  for (int k = 0; !s && k < n; ++k)
    printf("source %s documents %llu weight %.17g hash %s token_file %s\n", info[k].path,
           (unsigned long long)info[k].documents, info[k].weight, info[k].hash, info[k].token_path);
  st_status_free(s);
  free(info);
}

int st_cli_data(int argc, char** argv) {
  if (argc > 0 && !strcmp(argv[0], "inspect")) return st_cli_data_inspect(argc - 1, argv + 1);
  const char* decode = NULL;
  char** fill = NULL;
  char** args = st_xcalloc((size_t)argc + 1, sizeof(char*));
  int n = 0;
  st_status s = ST_OK;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--decode")) {
      if (i + 1 >= argc)
        s = st_status_make(ST_CODE_CONFIG, "--decode needs the ids (e.g. --decode 72,105 or --decode - for stdin)");
      else
        decode = argv[++i];
    } else if (!strcmp(argv[i], "--fill")) {
      if (i + 4 >= argc)
        s = st_status_make(ST_CODE_CONFIG, "--fill needs STREAM FIRST COUNT OUT (e.g. --fill 0 0 8 batch.bin)");
      else
        fill = argv + i + 1;
      i += 4;
    } else {
      args[n++] = argv[i];
    }
  }
  st_config* cfg = NULL;
  if (!s) s = st_cli_load_config("data", n, args, &cfg);
  if (!s) {
    st_plan_options o;
    s = st_plan_options_from_config(cfg, &o);
    st_dataset* ds = NULL;
    if (!s) s = st_dataset_open(&o.data, &ds);
    if (!s && decode)
      s = st__data_decode(ds, decode);
    else if (!s && fill)
      s = st__data_fill(ds, o.data.seq_len, fill);
    else if (!s)
      st__data_print(ds);
    st_dataset_destroy(ds);
    st_plan_options_deinit(&o);
  }
  st_config_destroy(cfg);
  free(args);
  return st_cli_report(s);
}
