/* metrics_server.c — the live metrics endpoint (obs.metrics_port): the
 * latest metrics object rendered in the Prometheus text exposition format
 * (0.0.4) and served on 127.0.0.1 by libmicrohttpd, a kept HTTP library
 * (Debian libmicrohttpd-dev), from its own polling thread. The trainer's
 * thread only merges a copy of each metrics line into the snapshot under
 * the mutex; rendering happens on a request, so a step pays for a deep
 * copy of one small object and nothing else. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"

#ifndef STRATA_NO_METRICS_HTTP
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif

/* ---- rendering ----------------------------------------------------------- */

void st_metrics_format_value(double x, char out[ST_DOUBLE_CHARS]) {
  if (isnan(x))
    snprintf(out, ST_DOUBLE_CHARS, "NaN");
  else if (isinf(x))
    snprintf(out, ST_DOUBLE_CHARS, "%s", x > 0 ? "+Inf" : "-Inf");
  else
    st_format_double(x, out);
}

/* |n| bytes of |s| with characters outside [a-zA-Z0-9_] as '_' (the
 * format's name syntax; ':' is for recording rules). */
static void st__append_name(st_strbuf* b, const char* s, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    st_strbuf_append_n(b, ok ? &c : "_", 1);
  }
}

/* The metric name for field |field| (+ "_" |sub| when given): "strata_",
 * characters outside [a-zA-Z0-9_] as '_', the unit suffixes spelled out. */
static void st__metric_name(st_strbuf* b, const char* field, const char* sub) {
  st_strbuf_reset(b);
  st_strbuf_append(b, "strata_");
  size_t n = strlen(field);
  const char* suffix = "";
  /* Byte counts whose metrics.jsonl name carries no unit: Prometheus wants
   * the base unit as the name's last word. */
  static const char* const kBytes[] = {"peak_live_by_category", "peak_live_by_category_predicted"};
  for (size_t i = 0; i < sizeof kBytes / sizeof kBytes[0]; ++i)
    if (!strcmp(field, kBytes[i])) suffix = "_bytes";
  if (n > 6 && !strcmp(field + n - 6, "_per_s")) {
    n -= 6;
    suffix = "_per_second";
  } else if (n > 2 && !strcmp(field + n - 2, "_s")) {
    n -= 2;
    suffix = "_seconds";
  }
  st__append_name(b, field, n);
  st_strbuf_append(b, suffix);
  if (sub) {
    st_strbuf_append(b, "_");
    st__append_name(b, sub, strlen(sub));
  }
}

/* The label name of a nested field: the word after "_by_" ("category" of
 * peak_live_by_category_predicted), else "key". */
static void st__label_name(st_strbuf* b, const char* field) {
  st_strbuf_reset(b);
  const char* by = strstr(field, "_by_");
  /* A label name may not start with a digit. */
  if (by && by[4] && !(by[4] >= '0' && by[4] <= '9')) st__append_name(b, by + 4, strcspn(by + 4, "_"));
  if (!b->len) st_strbuf_append(b, "key");
}

/* A label value as the format escapes it: \\, \", \n. */
static void st__label_value(st_strbuf* out, const char* v) {
  for (const char* p = v; *p; ++p) {
    if (*p == '\\')
      st_strbuf_append(out, "\\\\");
    else if (*p == '"')
      st_strbuf_append(out, "\\\"");
    else if (*p == '\n')
      st_strbuf_append(out, "\\n");
    else
      st_strbuf_append_n(out, p, 1);
  }
}

static bool st__is_sample(const json_t* v) { return json_is_number(v) || json_is_null(v) || json_is_boolean(v); }

static void st__sample(st_strbuf* out, const char* name, const char* run_id, const char* label, const char* key,
                       const json_t* v) {
  st_strbuf_append(out, name);
  st_strbuf_append(out, "{run=\"");
  st__label_value(out, run_id);
  st_strbuf_append(out, "\"");
  if (label) {
    st_strbuf_printf(out, ",%s=\"", label);
    st__label_value(out, key);
    st_strbuf_append(out, "\"");
  }
  st_strbuf_append(out, "} ");
  if (json_is_integer(v)) {
    st_strbuf_printf(out, "%lld", (long long)json_integer_value(v));
  } else if (json_is_boolean(v)) {
    st_strbuf_append(out, json_is_true(v) ? "1" : "0");
  } else {
    char num[ST_DOUBLE_CHARS];
    st_metrics_format_value(json_is_real(v) ? json_real_value(v) : NAN, num);
    st_strbuf_append(out, num);
  }
  st_strbuf_append(out, "\n");
}

/* HELP text escapes backslash and newline; field names are plain, but the
 * snapshot is whatever the caller handed in. */
static void st__family_head(st_strbuf* out, const char* name, const char* field, const char* sub, const char* label) {
  st_strbuf_printf(out, "# HELP %s The latest metrics.jsonl value of ", name);
  for (const char* p = field; *p; ++p) {
    if (*p == '\\')
      st_strbuf_append(out, "\\\\");
    else if (*p == '\n')
      st_strbuf_append(out, "\\n");
    else
      st_strbuf_append_n(out, p, 1);
  }
  if (sub) st_strbuf_printf(out, " (member %s)", sub);
  if (label) st_strbuf_printf(out, ", by %s", label);
  st_strbuf_append(out, " (docs/using.md).\n");
  st_strbuf_printf(out, "# TYPE %s gauge\n", name);
}

void st_metrics_render(const json_t* snapshot, const char* run_id, st_strbuf* out) {
  st_strbuf name = {0}, label = {0};
  if (!run_id) run_id = "";
  const char* field;
  json_t* v;
  json_object_foreach((json_t*)snapshot, field, v) {
    if (st__is_sample(v)) {
      st__metric_name(&name, field, NULL);
      st__family_head(out, name.data, field, NULL, NULL);
      st__sample(out, name.data, run_id, NULL, NULL, v);
      continue;
    }
    if (!json_is_object(v) || !json_object_size(v)) continue;
    st__label_name(&label, field);
    const char* key;
    json_t* e;
    /* An object of numbers: one family labelled by key. */
    bool flat = false;
    json_object_foreach(v, key, e) flat |= st__is_sample(e);
    if (flat) {
      st__metric_name(&name, field, NULL);
      st__family_head(out, name.data, field, NULL, label.data);
      json_object_foreach(v, key, e) if (st__is_sample(e)) st__sample(out, name.data, run_id, label.data, key, e);
      continue;
    }
    /* An object of objects: one family per inner field, in order of first
     * appearance, each labelled by the outer key (samples of one family
     * must be contiguous). */
    json_t* subs = json_array();
    json_object_foreach(v, key, e) {
      if (!json_is_object(e)) continue;
      const char* sk;
      json_t* se;
      json_object_foreach(e, sk, se) {
        if (!st__is_sample(se)) continue;
        bool seen = false;
        for (size_t i = 0; i < json_array_size(subs) && !seen; ++i)
          seen = !strcmp(json_string_value(json_array_get(subs, i)), sk);
        if (!seen) json_array_append_new(subs, json_string(sk));
      }
    }
    for (size_t i = 0; i < json_array_size(subs); ++i) {
      const char* sub = json_string_value(json_array_get(subs, i));
      st__metric_name(&name, field, sub);
      st__family_head(out, name.data, field, sub, label.data);
      json_object_foreach(v, key, e) {
        json_t* se = json_is_object(e) ? json_object_get(e, sub) : NULL;
        if (se && st__is_sample(se)) st__sample(out, name.data, run_id, label.data, key, se);
      }
    }
    json_decref(subs);
  }
  st_strbuf_free(&name);
  st_strbuf_free(&label);
}

/* ---- the server ------------------------------------------------------------ */

#ifdef STRATA_NO_METRICS_HTTP

bool st_metrics_server_available(void) { return false; }

st_status st_metrics_server_start(int port, const char* run_id, st_metrics_server** out) {
  (void)run_id;
  *out = NULL;
  return st_status_make(ST_CODE_CONFIG,
                        "obs.metrics_port=%d: this strata binary was built without the metrics endpoint (make "
                        "build-portable leaves libmicrohttpd out: its TLS dependency gnutls cannot be linked "
                        "statically); use a `make build` binary, or set obs.metrics_port=0",
                        port);
}

void st_metrics_server_publish(st_metrics_server* server, const json_t* metrics) {
  (void)server;
  (void)metrics;
}

void st_metrics_server_stop(st_metrics_server* server) { (void)server; }

#else

struct st_metrics_server {
  struct MHD_Daemon* daemon;
  pthread_mutex_t mu; /* guards snapshot and log */
  json_t* snapshot;   /* owned; the merged metrics objects */
  char* run_id;       /* owned */
  char log[512];      /* libmicrohttpd's last message (why a bind failed) */
};

bool st_metrics_server_available(void) { return true; }

static void st__mhd_log(void* cls, const char* fmt, va_list ap) {
  st_metrics_server* srv = cls;
  pthread_mutex_lock(&srv->mu);
  vsnprintf(srv->log, sizeof(srv->log), fmt, ap);
  size_t n = strlen(srv->log);
  while (n && (srv->log[n - 1] == '\n' || srv->log[n - 1] == '.')) srv->log[--n] = '\0';
  pthread_mutex_unlock(&srv->mu);
}

static enum MHD_Result st__reply(struct MHD_Connection* c, unsigned code, char* body /* freed by MHD */,
                                 const char* type) {
  struct MHD_Response* r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  enum MHD_Result q = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return q;
}

/* Runs on libmicrohttpd's thread. A GET has no body, so the first call of
 * a request can answer it. */
static enum MHD_Result st__handle(void* cls, struct MHD_Connection* c, const char* url, const char* method,
                                  const char* version, const char* upload_data, size_t* upload_size, void** req) {
  (void)version;
  (void)upload_data;
  (void)req;
  st_metrics_server* srv = cls;
  if (*upload_size) {
    *upload_size = 0; /* a body is not read: the reply below refuses the method */
    return MHD_YES;
  }
  const char* text = "text/plain; charset=utf-8";
  if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
    return st__reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, st_xstrdup("only GET /metrics is served\n"), text);
  if (strcmp(url, "/metrics"))
    return st__reply(c, MHD_HTTP_NOT_FOUND, st_xstrdup("not found: strata serves GET /metrics\n"), text);
  st_strbuf b = {0};
  pthread_mutex_lock(&srv->mu);
  st_metrics_render(srv->snapshot, srv->run_id, &b);
  pthread_mutex_unlock(&srv->mu);
  return st__reply(c, MHD_HTTP_OK, st_strbuf_take(&b), "text/plain; version=0.0.4; charset=utf-8");
}

st_status st_metrics_server_start(int port, const char* run_id, st_metrics_server** out) {
  *out = NULL;
  if (port < 1 || port > 65535)
    return st_status_make(ST_CODE_CONFIG, "obs.metrics_port=%d: not a TCP port (1..65535, or 0 for no endpoint)", port);
  st_metrics_server* srv = st_xcalloc(1, sizeof(*srv));
  pthread_mutex_init(&srv->mu, NULL);
  srv->snapshot = json_object();
  srv->run_id = st_xstrdup(run_id ? run_id : "");
  /* Loopback only: metrics are for the machine's own scraper (or an SSH
   * tunnel), never the network. */
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  srv->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port, NULL, NULL,
                                 st__handle, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr*)&addr,
                                 MHD_OPTION_EXTERNAL_LOGGER, st__mhd_log, srv, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)16, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  if (!srv->daemon) {
    st_status s = st_status_make(ST_CODE_CONFIG,
                                 "obs.metrics_port=%d: cannot serve metrics on 127.0.0.1:%d (%s); choose a free "
                                 "port, or 0 for no endpoint",
                                 port, port, srv->log[0] ? srv->log : "libmicrohttpd could not start");
    st_metrics_server_stop(srv);
    return s;
  }
  *out = srv;
  return ST_OK;
}

void st_metrics_server_publish(st_metrics_server* srv, const json_t* metrics) {
  if (!srv || !json_is_object(metrics)) return;
  json_t* copy = json_deep_copy(metrics);
  if (!copy) st_oom("metrics snapshot");
  pthread_mutex_lock(&srv->mu);
  json_object_update(srv->snapshot, copy);
  pthread_mutex_unlock(&srv->mu);
  json_decref(copy);
}

void st_metrics_server_stop(st_metrics_server* srv) {
  if (!srv) return;
  if (srv->daemon) MHD_stop_daemon(srv->daemon);
  pthread_mutex_destroy(&srv->mu);
  json_decref(srv->snapshot);
  free(srv->run_id);
  free(srv);
}

#endif
