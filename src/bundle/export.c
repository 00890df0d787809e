/* export.c — runs the exporter, `python -m strata_jax.export`, as a child
 * process into a bundle folder (docs/bundle.md, "Export"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/base.h"
#include "strata/bundle.h"

char* st_bundle_python(void) { return st_python_path(); }

st_status st_bundle_export(const st_bundle_export_args* args) {
  const char* dir = args->dir;
  const char* mesh = args->mesh;
  /* The parent folder must exist for the exporter's rename into place. */
  char* parent = st_xstrdup(dir);
  char* slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = '\0';
    st_status s = st_fs_mkdirs(parent);
    if (s) {
      free(parent);
      return st_status_annotate(s, "creating the bundle folder");
    }
  }
  free(parent);
  /* The progress line goes to the stderr strata was given, which the log
   * replaces in the child: a duplicate without close-on-exec survives exec. */
  int tty = args->progress ? dup(2) : -1;
  char tty_arg[16];
  snprintf(tty_arg, sizeof(tty_arg), "%d", tty);
  const char* argv[14] = {"--model-json", args->model_json, "--out", dir, "--bundle-key", args->key};
  int argc = 6;
  if (mesh && mesh[0]) {
    argv[argc++] = "--mesh";
    argv[argc++] = mesh;
  }
  char procs_arg[16];
  if (args->process_fsdp > 1) {
    snprintf(procs_arg, sizeof(procs_arg), "%d", args->process_fsdp);
    argv[argc++] = "--process-fsdp";
    argv[argc++] = procs_arg;
  }
  if (tty >= 0) {
    argv[argc++] = "--progress-fd";
    argv[argc++] = tty_arg;
  }
  argv[argc] = NULL;
  st_strbuf log = {0};
  st_strbuf_printf(&log, "%s.export.log", dir);
  /* The exporter's exit 2 is a model config it refuses (docs/model.md,
   * "Export"): an unknown block kind, say, which only its registry knows.
   * Export is trace + lower only: JAX stays off any accelerator. */
  st_python_job job = {.what = "exporting the bundle", .module = "strata_jax.export", .args = argv,
                       .log_path = log.data, .code = ST_CODE_RUNTIME, .code_on_exit2 = ST_CODE_CONFIG,
                       .jax_platforms = "cpu", .stop_signal = args->stop_signal};
  st_status s = st_python_run(&job);
  if (tty >= 0) close(tty);
  st_strbuf_free(&log);
  return s;
}
