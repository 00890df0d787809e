/* cmd_data.c — `strata data CONFIG [k=v ...] [--decode IDS]`: tokenizes the
 * corpus (or validates the token file) and prints the token file, its
 * tokenizer and split sizes. The Python reference trainer uses it to read
 * exactly the same tokens. With --decode, it writes the bytes of the ids
 * IDS (comma- or space-separated; "-": read them from stdin) under the
 * corpus's tokenizer to stdout instead (docs/data.md, "Tokenizer"). */
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

int st_cli_data(int argc, char** argv) {
  if (argc > 0 && !strcmp(argv[0], "inspect")) return st_cli_data_inspect(argc - 1, argv + 1);
  const char* decode = NULL;
  char** args = st_xcalloc((size_t)argc + 1, sizeof(char*));
  int n = 0;
  st_status s = ST_OK;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--decode")) {
      if (i + 1 >= argc)
        s = st_status_make(ST_CODE_CONFIG, "--decode needs the ids (e.g. --decode 72,105 or --decode - for stdin)");
      else
        decode = argv[++i];
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
    else if (!s)
      printf("%s\ntokens %llu train %llu validation %llu\ntokenizer %s\n", st_dataset_token_path(ds),
             (unsigned long long)st_dataset_token_count(ds), (unsigned long long)st_dataset_split_tokens(ds, 0),
             (unsigned long long)st_dataset_split_tokens(ds, 1), st_dataset_tokenizer_hash(ds));
    st_dataset_destroy(ds);
    st_plan_options_deinit(&o);
  }
  st_config_destroy(cfg);
  free(args);
  return st_cli_report(s);
}
