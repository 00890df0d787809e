/* context.c — the task context of a run (context.json, docs/design.md §4):
 * enough to tell, months later, what ran where with which versions. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"

/* First line that `git -C <dir> <args...>` prints, or "" (the context is
 * best effort: a machine without git still trains). git runs without a
 * shell, so a source folder whose name holds quotes or spaces is passed
 * through unchanged. */
static void st__git_line(const char* dir, const char* const* args, char* out, size_t n) {
  out[0] = '\0';
  int fd[2];
  if (pipe(fd) != 0) return;
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]);
    close(fd[1]);
    return;
  }
  if (pid == 0) {
    const char* argv[16] = {"git", "-C", dir};
    int k = 3;
    for (int i = 0; args[i] && k < 15; ++i) argv[k++] = args[i];
    argv[k] = NULL;
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDERR_FILENO);
    dup2(fd[1], STDOUT_FILENO);
    close(fd[0]);
    close(fd[1]);
    execvp("git", (char* const*)argv);
    _exit(127);
  }
  close(fd[1]);
  FILE* p = fdopen(fd[0], "r");
  if (p) {
    if (fgets(out, (int)n, p)) out[strcspn(out, "\n")] = '\0';
    char drain[4096];
    while (fread(drain, 1, sizeof(drain), p) > 0) {
    }
    fclose(p);
  } else {
    close(fd[0]);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out[0] = '\0';
}

static void st__proc_field(const char* file, const char* key, char* out, size_t n) {
  out[0] = '\0';
  FILE* f = fopen(file, "r");
  if (!f) return;
  char line[512];
  size_t klen = strlen(key);
  while (fgets(line, sizeof(line), f)) {
    if (strncmp(line, key, klen) != 0) continue;
    char* colon = strchr(line, ':');
    if (!colon) continue;
    colon++;
    while (*colon == ' ' || *colon == '\t') colon++;
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(out, n, "%s", colon);
    break;
  }
  fclose(f);
}

/* Who ran it: an explicit name wins; else the git identity of the folder
 * strata was started in (a checkout's own user.name, else the global one),
 * else the login name. Never the network, never an error: a machine
 * without git (execvp fails) or without a configured identity falls
 * through to the next source. */
const char* st_context_author(const char* override, char* out, size_t n) {
  if (override && override[0]) {
    snprintf(out, n, "%s", override);
    return "config";
  }
  char name[256], email[256];
  const char* qname[] = {"config", "user.name", NULL};
  const char* qemail[] = {"config", "user.email", NULL};
  st__git_line(".", qname, name, sizeof(name));
  st__git_line(".", qemail, email, sizeof(email));
  if (name[0] || email[0]) {
    if (name[0] && email[0]) snprintf(out, n, "%s <%s>", name, email);
    else snprintf(out, n, "%s", name[0] ? name : email);
    return "git";
  }
  const char* user = getenv("USER");
  if (!user || !user[0]) user = getenv("LOGNAME");
  if (user && user[0]) {
    snprintf(out, n, "%s", user);
    return "env";
  }
  snprintf(out, n, "unknown");
  return "unknown";
}

json_t* st_context_json(const st_context_facts* f) {
  json_t* c = st_json_obj();
  st_json_put_int(c, "schema", 1);
  st_json_put_str(c, "run_id", f->run_id);
  st_json_put_str(c, "strata_version", STRATA_VERSION);
  char author[512];
  const char* author_source = st_context_author(f->author, author, sizeof(author));
  st_json_put_str(c, "author", author);
  st_json_put_str(c, "author_source", author_source);
  char commit[128], dirty[256];
  const char* rev[] = {"rev-parse", "HEAD", NULL};
  const char* status[] = {"status", "--porcelain", "--untracked-files=no", NULL};
  st__git_line(st_source_dir(), rev, commit, sizeof(commit));
  st__git_line(st_source_dir(), status, dirty, sizeof(dirty));
  st_json_put_str(c, "git_commit", commit);
  st_json_put(c, "git_dirty", commit[0] ? st_json_bool(dirty[0] != '\0') : json_null());
  st_json_put_str(c, "jax_version", f->jax_version);
  st_json_put_str(c, "jaxlib_version", f->jaxlib_version);
  if (f->runtime) {
    const st_context_runtime* r = f->runtime;
    st_json_put_str(c, "plugin_path", r->plugin_path);
    st_json_put_str(c, "plugin_xla_version", r->xla_version);
    st_json_put_str(c, "platform_name", r->platform_name);
    st_json_put_str(c, "platform_version", r->platform_version);
    char api[32];
    snprintf(api, sizeof(api), "%d.%d", r->api_major, r->api_minor);
    st_json_put_str(c, "pjrt_api_version", api);
    json_t* devices = st_json_arr();
    for (int i = 0; i < r->device_count && i < ST_CONTEXT_MAX_DEVICES; ++i) {
      json_t* dev = st_json_obj();
      st_json_put_int(dev, "id", r->device_ids[i]);
      st_json_put_str(dev, "kind", r->device_kinds[i]);
      st_json_push(devices, dev);
    }
    st_json_put(c, "devices", devices);
  }
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  st_json_put_str(c, "host", host);
  char cpu[256];
  st__proc_field("/proc/cpuinfo", "model name", cpu, sizeof(cpu));
  st_json_put_str(c, "cpu_model", cpu);
  st_json_put_int(c, "cpu_cores", sysconf(_SC_NPROCESSORS_ONLN));
  char mem[128];
  st__proc_field("/proc/meminfo", "MemTotal", mem, sizeof(mem));
  st_json_put_str(c, "memory", mem);
  /* The environment variables that change what strata or XLA does. */
  static const char* kEnv[] = {"XLA_FLAGS", "STRATA_PJRT_PLUGIN", "STRATA_CACHE_DIR", "STRATA_PYTHON", "PJRT_NPROC",
                               "JAX_PLATFORMS", "OMP_NUM_THREADS", "STRATA_KERNELS_ISA"};
  json_t* env = st_json_obj();
  for (size_t i = 0; i < sizeof(kEnv) / sizeof(kEnv[0]); ++i) {
    const char* v = getenv(kEnv[i]);
    if (v) st_json_put_str(env, kEnv[i], v);
  }
  st_json_put(c, "environment", env);
  st_json_put_str(c, "config_hash", f->config_hash);
  st_json_put_str(c, "bundle_key", f->bundle_key);
  if (f->tokenizer_hash) st_json_put_str(c, "tokenizer_hash", f->tokenizer_hash);
  if (f->peak) st_json_put(c, "peak", json_incref(f->peak));
  if (f->kernels) st_json_put(c, "kernels", json_incref(f->kernels));
  if (f->model) st_json_put(c, "model", json_incref(f->model));
  if (f->data) st_json_put(c, "data", json_incref(f->data));
  return c;
}
