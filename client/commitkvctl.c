/* commitkvctl - the administrator's view of a running commitkvd.
 *
 *   commitkvctl [--socket ENDPOINT] [--attach-socket PATH] COMMAND
 *     status            daemon version, backend (and why), uptime, sockets
 *     sessions          one line per session (this tenant's; every tenant's for an admin)
 *     stats [--json]    totals; --json prints one JSON object (DESIGN.md §7)
 *     drop ID [TENANT]  drop a session (TENANT: admin only)
 *     save ID [--committed-only] [--name NAME]
 *                       write the session to the daemon's state directory (a snapshot)
 *     restore ID [--name NAME]
 *                       bring a session back from its snapshot (detached once this exits:
 *                       a worker resumes it)
 *     snapshots [--json] the state directory's snapshots (this tenant's; every tenant's for an admin)
 *     metrics [--metrics ADDR] [--raw]
 *                       the daemon's Prometheus figures, per tenant
 *
 * It attaches like a worker, without mapping arenas; `metrics` only fetches
 * http://ADDR/metrics (no attach needed). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client/rpc.h"

static int fail(ckv_client *c, const char *what, int r) {
  fprintf(stderr, "commitkvctl: %s: %s (%s)%s%s\n", what, ckv_strerror(r), ckv_status_name(r),
          c && *ckv_client_last_error(c) ? ": " : "", c ? ckv_client_last_error(c) : "");
  return 1;
}

static int request(ckv_client *c, Commitkv__V1__Request *req, Commitkv__V1__Response **rep, const char *what) {
  int r = ckv_rpc(c, req, rep);
  if (r < 0) return fail(c, what, r);
  return 0;
}

static void json_str(const char *s) {
  putchar('"');
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static void json_tokens(const Commitkv__V1__TokenCounts *t) {
  printf("{\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64 ", \"recycled\": %" PRIu64
         ", \"cold\": %" PRIu64 ", \"dropped\": %" PRIu64 ", \"shared\": %" PRIu64 "}",
         t ? t->draft : 0, t ? t->staged : 0, t ? t->committed : 0, t ? t->recycled : 0, t ? t->cold : 0,
         t ? t->dropped : 0, t ? t->shared : 0);
}

static void json_bytes(const Commitkv__V1__ByteCounts *b) {
  printf("{\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64 ", \"total\": %" PRIu64
         ", \"fp16_equivalent\": %" PRIu64 ", \"shared\": %" PRIu64 "}",
         b ? b->draft : 0, b ? b->staged : 0, b ? b->committed : 0, b ? b->total : 0, b ? b->fp16_equivalent : 0,
         b ? b->shared : 0);
}

static int cmd_stats(ckv_client *c, bool json) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatsRequest sr = COMMITKV__V1__STATS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "stats")) return 1;
  const Commitkv__V1__Stats *s = rep->stats;
  if (json) {
    printf("{\"sessions\": %" PRIu64 ", \"clients\": %" PRIu64 ", \"tokens\": ", s->sessions, s->clients);
    json_tokens(s->tokens);
    printf(", \"bytes\": ");
    json_bytes(s->bytes);
    printf(", \"arenas\": [");
    for (size_t i = 0; i < s->n_arenas; i++) {
      printf("%s{\"kind\": ", i ? ", " : "");
      json_str(s->arenas[i]->kind);
      printf(", \"tenant\": ");
      json_str(s->arenas[i]->tenant);
      printf(", \"arena_id\": %u, \"bytes_total\": %" PRIu64 ", \"bytes_committed\": %" PRIu64
             ", \"bytes_used\": %" PRIu64 "}",
             s->arenas[i]->arena_id, s->arenas[i]->bytes_total, s->arenas[i]->bytes_committed, s->arenas[i]->bytes_used);
    }
    printf("], \"tenants\": [");
    for (size_t i = 0; i < s->n_tenants; i++) {
      const Commitkv__V1__TenantStats *t = s->tenants[i];
      printf("%s{\"name\": ", i ? ", " : "");
      json_str(t->name);
      printf(", \"sessions\": %" PRIu64 ", \"clients\": %" PRIu64 ", \"quota_bytes\": %" PRIu64
             ", \"disk_bytes\": %" PRIu64 ", \"snapshots\": %" PRIu64 ", \"quota_disk\": %" PRIu64
             ", \"max_snapshots\": %" PRIu32 ", \"tokens\": ",
             t->sessions, t->clients, t->quota_bytes, t->disk_bytes, t->snapshots, t->quota_disk, t->max_snapshots);
      json_tokens(t->tokens);
      printf(", \"bytes\": ");
      json_bytes(t->bytes);
      printf(", \"dedup_ratio\": %.4f, \"prefix\": {\"lookup_tokens\": %" PRIu64 ", \"hit_tokens\": %" PRIu64
             ", \"index_keys\": %" PRIu64 ", \"index_slots\": %" PRIu32 ", \"index_complete\": %s}}",
             t->dedup_ratio, t->prefix_lookup_tokens, t->prefix_hit_tokens, t->prefix_index_keys,
             t->prefix_index_slots, t->prefix_index_complete ? "true" : "false");
    }
    printf("], \"detached_sessions\": %" PRIu64 ", \"leases_expired\": %" PRIu64 ", \"sessions_detached\": %" PRIu64
           ", \"sessions_resumed\": %" PRIu64 ", \"sessions_expired\": %" PRIu64 ", \"requests\": %" PRIu64
           ", \"errors\": %" PRIu64 ", \"rounds\": %" PRIu64 ", \"uptime_ms\": %" PRIu64
           ", \"semantic_given_tokens\": %" PRIu64 ", \"pending_tokens\": %" PRIu64 ", \"compress_queue\": %" PRIu64
           ", \"compress_jobs\": %" PRIu64 ", \"compress_refused\": %" PRIu64 ", \"transitions_staged\": %" PRIu64
           ", \"transitions_committed\": %" PRIu64 ", \"transitions_recycled\": %" PRIu64
           ", \"autosave_lag_ms\": %" PRIu64 ", \"disk_refused_saves\": %" PRIu64
           ", \"disk_refused_autosaves\": %" PRIu64 ", \"disk_refused_offloads\": %" PRIu64 ", \"backend\": ",
           s->detached_sessions, s->leases_expired, s->sessions_detached, s->sessions_resumed, s->sessions_expired,
           s->requests, s->errors, s->rounds, s->uptime_ms, s->semantic_given_tokens, s->pending_tokens,
           s->compress_queue, s->compress_jobs, s->compress_refused, s->transitions_staged, s->transitions_committed,
           s->transitions_recycled, s->autosave_lag_ms, s->disk_refused_saves, s->disk_refused_autosaves,
           s->disk_refused_offloads);
    json_str(s->backend);
    printf(", \"remote\": ");
    if (s->remote) {
      const Commitkv__V1__RemoteStats *r = s->remote;
      printf("{\"url\": ");
      json_str(r->url);
      printf(", \"saves\": %" PRIu64 ", \"save_bytes\": %" PRIu64 ", \"loads\": %" PRIu64 ", \"load_bytes\": %" PRIu64
             ", \"misses\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"connected\": %s}",
             r->saves, r->save_bytes, r->loads, r->load_bytes, r->misses, r->errors, r->connected ? "true" : "false");
    } else {
      printf("null");
    }
    printf(", \"tiers\": [");
    for (size_t i = 0; i < s->n_tiers; i++) {
      const Commitkv__V1__TierStats *t = s->tiers[i];
      printf("%s{\"tier\": ", i ? ", " : "");
      json_str(t->tier);
      printf(", \"bytes\": %" PRIu64 ", \"capacity\": %" PRIu64 ", \"sessions\": %" PRIu64 ", \"hits\": %" PRIu64
             ", \"misses\": %" PRIu64 ", \"offloads\": %" PRIu64 ", \"offload_bytes\": %" PRIu64
             ", \"restores\": %" PRIu64 ", \"restore_bytes\": %" PRIu64 ", \"cancelled\": %" PRIu64
             ", \"refused\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"pressure_moves\": %" PRIu64
             ", \"hit_tokens\": %" PRIu64 ", \"miss_tokens\": %" PRIu64 "}",
             t->bytes, t->capacity, t->sessions, t->hits, t->misses, t->offloads, t->offload_bytes, t->restores,
             t->restore_bytes, t->cancelled, t->refused, t->errors, t->pressure_moves, t->hit_tokens, t->miss_tokens);
    }
    printf("]}\n");
  } else {
    const Commitkv__V1__ByteCounts *b = s->bytes;
    const Commitkv__V1__TokenCounts *t = s->tokens;
    printf("sessions %" PRIu64 " (%" PRIu64 " detached), clients %" PRIu64 ", backend %s\n", s->sessions,
           s->detached_sessions, s->clients, s->backend);
    printf("%-10s %14s %16s\n", "state", "tokens", "bytes");
    printf("%-10s %14" PRIu64 " %16" PRIu64 "\n", "draft", t->draft, b->draft);
    printf("%-10s %14" PRIu64 " %16" PRIu64 "\n", "staged", t->staged, b->staged);
    printf("%-10s %14" PRIu64 " %16" PRIu64 "\n", "committed", t->committed, b->committed);
    printf("%-10s %14" PRIu64 " %16s  (%" PRIu64 " demoted, bytes kept in cold blocks; %" PRIu64
           " dropped for good)\n",
           "recycled", t->recycled, "-", t->cold, t->dropped);
    printf("%-10s %14s %16" PRIu64 "  (FP16 equivalent %" PRIu64 ", ratio %.3f)\n", "total", "", b->total,
           b->fp16_equivalent, b->fp16_equivalent ? (double)b->total / (double)b->fp16_equivalent : 0.0);
    for (size_t i = 0; i < s->n_arenas; i++)
      printf("arena %u (%s, tenant %s): %" PRIu64 " of %" PRIu64 " bytes used, %" PRIu64 " backed\n",
             s->arenas[i]->arena_id, s->arenas[i]->kind, s->arenas[i]->tenant, s->arenas[i]->bytes_used,
             s->arenas[i]->bytes_total, s->arenas[i]->bytes_committed);
    printf("requests %" PRIu64 ", errors %" PRIu64 ", rounds %" PRIu64 ", leases expired %" PRIu64 "\n", s->requests,
           s->errors, s->rounds, s->leases_expired);
    printf("sessions detached %" PRIu64 ", resumed %" PRIu64 ", expired unresumed %" PRIu64 "\n",
           s->sessions_detached, s->sessions_resumed, s->sessions_expired);
    if (s->remote)
      printf("remote %s (%s): %" PRIu64 " saves (%" PRIu64 " bytes), %" PRIu64 " loads (%" PRIu64 " bytes), %" PRIu64
             " misses, %" PRIu64 " errors\n",
             s->remote->url, s->remote->connected ? "connected" : "not connected", s->remote->saves,
             s->remote->save_bytes, s->remote->loads, s->remote->load_bytes, s->remote->misses, s->remote->errors);
    for (size_t i = 0; i < s->n_tiers; i++) {
      const Commitkv__V1__TierStats *ti = s->tiers[i];
      printf("tier %-7s %" PRIu64 " bytes of %" PRIu64 ", %" PRIu64 " sessions, %" PRIu64 " hits, %" PRIu64
             " misses, %" PRIu64 " offloads, %" PRIu64 " restores, %" PRIu64 " cancelled, %" PRIu64 " refused, %" PRIu64
             " errors\n",
             ti->tier, ti->bytes, ti->capacity, ti->sessions, ti->hits, ti->misses, ti->offloads, ti->restores, ti->cancelled,
             ti->refused, ti->errors);
    }
  }
  ckv_rpc_free(rep);
  return 0;
}

static int cmd_status(ckv_client *c) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__StatusRequest sr = COMMITKV__V1__STATUS_REQUEST__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_STATUS;
  req.status = &sr;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "status")) return 1;
  const Commitkv__V1__DaemonStatus *d = rep->status;
  printf("commitkvd %s (protocol %u), pid %u, up %.1f s\n", d->version, d->protocol_version, d->pid,
         (double)d->uptime_ms / 1000.0);
  printf("backend   %s: %s\n", d->backend, d->backend_reason);
  printf("socket    %s\nattach    %s\n", d->socket, d->attach_socket);
  printf("tenant    %s%s\n", *ckv_client_tenant(c) ? ckv_client_tenant(c) : "(none)", c->admin ? " (admin)" : "");
  ckv_rpc_free(rep);
  return 0;
}

static int cmd_sessions(ckv_client *c) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSessions ls = COMMITKV__V1__LIST_SESSIONS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SESSIONS;
  req.list_sessions = &ls;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "sessions")) return 1;
  const Commitkv__V1__SessionList *l = rep->session_list;
  printf("%-24s %-10s %-9s %-8s %8s %8s %8s %8s %8s %12s %7s %s\n", "session", "tenant", "policy", "attached", "draft",
         "staged", "commit", "recycled", "shared", "bytes", "vs_fp16", "tier");
  for (size_t i = 0; i < l->n_sessions; i++) {
    const Commitkv__V1__SessionInfo *s = l->sessions[i];
    double ratio = s->bytes->fp16_equivalent ? (double)s->bytes->total / (double)s->bytes->fp16_equivalent : 0.0;
    printf("%-24s %-10s %-9s %-8s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %12" PRIu64
           " %7.3f %s\n",
           s->session_id, s->tenant, s->policy, s->attached ? "yes" : "no", s->tokens->draft, s->tokens->staged,
           s->tokens->committed, s->tokens->recycled, s->tokens->shared, s->bytes->total, ratio,
           s->tier && *s->tier ? s->tier : "primary");
  }
  ckv_rpc_free(rep);
  return 0;
}

static int cmd_drop(ckv_client *c, const char *id, const char *tenant) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__DropSession d = COMMITKV__V1__DROP_SESSION__INIT;
  d.session_id = (char *)id;
  d.tenant = (char *)(tenant ? tenant : "");
  req.body_case = COMMITKV__V1__REQUEST__BODY_DROP_SESSION;
  req.drop_session = &d;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "drop")) return 1;
  ckv_rpc_free(rep);
  printf("dropped %s\n", id);
  return 0;
}

/* The value after `flag` among argv[first..argc), or NULL. */
static const char *flag_value(int argc, char **argv, int first, const char *flag) {
  for (int i = first; i + 1 < argc; i++)
    if (strcmp(argv[i], flag) == 0) return argv[i + 1];
  return NULL;
}
static bool has_flag(int argc, char **argv, int first, const char *flag) {
  for (int i = first; i < argc; i++)
    if (strcmp(argv[i], flag) == 0) return true;
  return false;
}

static int cmd_save(ckv_client *c, const char *id, const char *name, bool committed_only) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__SaveSession sv = COMMITKV__V1__SAVE_SESSION__INIT;
  sv.session_id = (char *)id;
  sv.name = (char *)(name ? name : "");
  sv.committed_only = committed_only;
  req.body_case = COMMITKV__V1__REQUEST__BODY_SAVE_SESSION;
  req.save_session = &sv;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "save")) return 1;
  const Commitkv__V1__SessionSaved *o = rep->session_saved;
  printf("saved %s as snapshot %s: %" PRIu64 " bytes, %" PRIu64 " tokens kept, %" PRIu64 " not kept%s\n", id,
         o ? o->name : "?", o ? o->bytes : 0, o ? o->tokens : 0, o ? o->dropped_tokens : 0,
         committed_only ? " (committed only)" : "");
  ckv_rpc_free(rep);
  return 0;
}

static int cmd_restore(ckv_client *c, const char *id, const char *name) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__RestoreSession rs = COMMITKV__V1__RESTORE_SESSION__INIT;
  rs.session_id = (char *)id;
  rs.name = (char *)(name ? name : "");
  req.body_case = COMMITKV__V1__REQUEST__BODY_RESTORE_SESSION;
  req.restore_session = &rs;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "restore")) return 1;
  const Commitkv__V1__SessionOpened *o = rep->session_opened;
  printf("restored %s: %" PRIu64 " tokens, epoch %" PRIu64 ", model '%s' revision '%s'", id, o ? o->n_tokens : 0,
         o ? o->epoch : 0, o ? o->model_id : "", o ? o->model_revision : "");
  if (o && o->dropped_tokens) printf(", %" PRIu64 " tokens not kept by its save", o->dropped_tokens);
  printf("; detached: a worker resumes it (OpenSession with resume)\n");
  ckv_rpc_free(rep);
  return 0;
}

static int cmd_snapshots(ckv_client *c, bool json) {
  Commitkv__V1__Request req = COMMITKV__V1__REQUEST__INIT;
  Commitkv__V1__ListSnapshots ls = COMMITKV__V1__LIST_SNAPSHOTS__INIT;
  req.body_case = COMMITKV__V1__REQUEST__BODY_LIST_SNAPSHOTS;
  req.list_snapshots = &ls;
  Commitkv__V1__Response *rep;
  if (request(c, &req, &rep, "snapshots")) return 1;
  const Commitkv__V1__SnapshotList *l = rep->snapshot_list;
  if (json) printf("[");
  else
    printf("%-24s %-10s %-24s %10s %12s %-16s %-12s %s\n", "snapshot", "tenant", "session", "tokens", "bytes", "model",
           "revision", "saved");
  for (size_t i = 0; l && i < l->n_snapshots; i++) {
    const Commitkv__V1__SnapshotInfo *s = l->snapshots[i];
    if (json) {
      printf("%s{\"name\": ", i ? ", " : "");
      json_str(s->name);
      printf(", \"tenant\": ");
      json_str(s->tenant);
      printf(", \"session\": ");
      json_str(s->session_id);
      printf(", \"tokens\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"model_id\": ", s->tokens, s->bytes);
      json_str(s->model_id);
      printf(", \"model_revision\": ");
      json_str(s->model_revision);
      printf(", \"saved_at_ms\": %" PRIu64 ", \"committed_only\": %s, \"error\": ", s->saved_at_ms,
             s->committed_only ? "true" : "false");
      json_str(s->error);
      printf("}");
      continue;
    }
    if (s->error && *s->error) {
      printf("%-24s %-10s unreadable: %s\n", s->name, s->tenant, s->error);
      continue;
    }
    char when[32] = "?";
    time_t t = (time_t)(s->saved_at_ms / 1000);
    struct tm tm;
    if (localtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("%-24s %-10s %-24s %10" PRIu64 " %12" PRIu64 " %-16s %-12s %s%s\n", s->name, s->tenant, s->session_id,
           s->tokens, s->bytes, *s->model_id ? s->model_id : "-", *s->model_revision ? s->model_revision : "-", when,
           s->committed_only ? " (committed only)" : "");
  }
  if (json) printf("]\n");
  ckv_rpc_free(rep);
  return 0;
}

/* ---- metrics: Prometheus text over HTTP, shown per tenant --------------- */

/* GET http://ADDR/metrics ("HOST:PORT" or "[V6]:PORT") within timeout_ms.
 * Returns the body (malloc'd) or NULL after printing why. */
static char *http_get_metrics(const char *addr, int timeout_ms) {
  char host[256];
  const char *colon = strrchr(addr, ':');
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  const char *h = addr;
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (!colon || !colon[1] || hl == 0 || hl >= sizeof(host)) {
    fprintf(stderr, "commitkvctl: metrics: bad address '%s' (want HOST:PORT)\n", addr);
    return NULL;
  }
  memcpy(host, h, hl);
  host[hl] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
  int g = getaddrinfo(host, colon + 1, &hints, &res);
  if (g != 0) {
    fprintf(stderr, "commitkvctl: metrics: %s: %s\n", addr, gai_strerror(g));
    return NULL;
  }
  int fd = -1, err = ECONNREFUSED;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = errno;
    if (err == EINPROGRESS) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int soerr = 0;
      socklen_t sl = sizeof(soerr);
      if (poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
        break; /* connected */
      err = soerr ? soerr : ETIMEDOUT;
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    fprintf(stderr, "commitkvctl: metrics: cannot connect to %s: %s (is [daemon] metrics set to it?)\n", addr,
            strerror(err));
    return NULL;
  }
  char req[400];
  int n = snprintf(req, sizeof(req), "GET /metrics HTTP/1.0\r\nHost: %s\r\nUser-Agent: commitkvctl\r\n\r\n", addr);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  bool ok = buf && send(fd, req, (size_t)n, MSG_NOSIGNAL) == n;
  while (ok) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1) {
      fprintf(stderr, "commitkvctl: metrics: %s: no answer within %d ms\n", addr, timeout_ms);
      ok = false;
      break;
    }
    if (cap - len < 4096) {
      char *nb = cap < (256u << 20) ? realloc(buf, cap * 2) : NULL;
      if (!nb) {
        ok = false;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      ok = false;
      break;
    }
    len += (size_t)got;
  }
  close(fd);
  if (!ok) {
    free(buf);
    return NULL;
  }
  buf[len] = 0;
  char *body = strstr(buf, "\r\n\r\n");
  int status = 0;
  if (strncmp(buf, "HTTP/1.", 7) != 0 || sscanf(buf + 8, " %d", &status) != 1 || status != 200 || !body) {
    fprintf(stderr, "commitkvctl: metrics: %s answered: %.*s\n", addr, (int)strcspn(buf, "\r\n"), buf);
    free(buf);
    return NULL;
  }
  memmove(buf, body + 4, strlen(body + 4) + 1);
  return buf;
}

/* One sample of the text format, parsed in place (labels unescaped). */
#define MS_MAX_LABELS 4
typedef struct msample {
  char *name;
  char *key[MS_MAX_LABELS], *val[MS_MAX_LABELS];
  int n_labels;
  double value;
  size_t tenant; /* index into the tenant list; SIZE_MAX = no tenant label */
} msample;

static const char *ms_label(const msample *s, const char *key) {
  for (int i = 0; i < s->n_labels; i++)
    if (strcmp(s->key[i], key) == 0) return s->val[i];
  return NULL;
}

/* Parses `line` (modified); false for comments, blanks and junk. */
static bool ms_parse(char *line, msample *s) {
  if (*line == '#' || *line == 0) return false;
  s->name = line;
  s->n_labels = 0;
  char *p = line + strcspn(line, "{ ");
  if (*p == '{') {
    *p++ = 0;
    while (*p && *p != '}') {
      char *k = p, *eq = strchr(p, '=');
      if (!eq || eq[1] != '"') return false;
      *eq = 0;
      char *v = eq + 2, *w = v;
      for (p = v; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1]) {
          p++;
          *w++ = *p == 'n' ? '\n' : *p;
        } else {
          *w++ = *p;
        }
      }
      if (*p != '"') return false;
      p++;
      *w = 0;
      if (s->n_labels < MS_MAX_LABELS) {
        s->key[s->n_labels] = k;
        s->val[s->n_labels++] = v;
      }
      if (*p == ',') p++;
    }
    if (*p != '}') return false;
    p++;
  } else if (*p == ' ') {
    *p = 0;
    p++;
  } else {
    return false;
  }
  char *end;
  s->value = strtod(p, &end);
  return end != p;
}

typedef struct mview {
  msample *s;
  size_t n;
} mview;

/* The value of the first sample named `name` with label k=v (k NULL: any). */
static bool mv_get(mview v, const char *name, const char *k, const char *val, double *ret) {
  for (size_t i = 0; i < v.n; i++) {
    if (strcmp(v.s[i].name, name) != 0) continue;
    const char *l = k ? ms_label(&v.s[i], k) : NULL;
    if (k && (!l || strcmp(l, val) != 0)) continue;
    *ret = v.s[i].value;
    return true;
  }
  return false;
}

static double mv_val(mview v, const char *name, const char *k, const char *val) {
  double d = 0;
  mv_get(v, name, k, val, &d);
  return d;
}

/* "ReportRound: 3 rounds, mean 1.2 ms, p50 <= 2.5 ms, p99 <= 10 ms" from a
 * histogram; `extra` ends the line. */
static void print_histogram(mview v, const char *family, const char *what, const char *unit, const char *extra) {
  char name[128];
  snprintf(name, sizeof(name), "%s_count", family);
  double count = mv_val(v, name, NULL, NULL);
  snprintf(name, sizeof(name), "%s_sum", family);
  double sum = mv_val(v, name, NULL, NULL);
  printf("  %s: %.0f %s", what, count, unit);
  if (count > 0) {
    printf(", mean %.3f ms", 1e3 * sum / count);
    snprintf(name, sizeof(name), "%s_bucket", family);
    const double q[2] = {0.5, 0.99};
    for (int k = 0; k < 2; k++) {
      for (size_t i = 0; i < v.n; i++) {
        const char *le = ms_label(&v.s[i], "le");
        if (strcmp(v.s[i].name, name) != 0 || !le || v.s[i].value < q[k] * count) continue;
        if (strcmp(le, "+Inf") == 0)
          printf(", p%.0f above the last bucket", q[k] * 100);
        else
          printf(", p%.0f <= %g ms", q[k] * 100, 1e3 * strtod(le, NULL));
        break;
      }
    }
  }
  printf("%s\n", extra ? extra : "");
}

static void print_tenant(mview v, const char *tenant) {
  printf("\ntenant %s: %.0f sessions (%.0f detached), %.0f clients", tenant, mv_val(v, "commitkv_sessions", NULL, NULL),
         mv_val(v, "commitkv_detached_sessions", NULL, NULL), mv_val(v, "commitkv_clients", NULL, NULL));
  double quota = mv_val(v, "commitkv_quota_bytes", NULL, NULL);
  if (quota > 0)
    printf(", quota %.0f bytes\n", quota);
  else
    printf(", no quota of its own\n");
  /* Tiers, in the order the daemon lists them. */
  const char *tiers[8];
  int nt = 0;
  for (size_t i = 0; i < v.n && nt < 8; i++) {
    if (strcmp(v.s[i].name, "commitkv_tier_bytes") != 0) continue;
    const char *t = ms_label(&v.s[i], "tier");
    if (t) tiers[nt++] = t;
  }
  printf("  %-10s %14s", "state", "tokens");
  for (int t = 0; t < nt; t++) {
    char head[64];
    snprintf(head, sizeof(head), "bytes %s", tiers[t]);
    printf(" %20s", head);
  }
  putchar('\n');
  static const char *const states[] = {"draft", "staged", "committed", "recycled"};
  for (int s = 0; s < 4; s++) {
    printf("  %-10s %14.0f", states[s], mv_val(v, "commitkv_tokens", "state", states[s]));
    for (int t = 0; t < nt; t++) {
      double b = 0;
      bool found = false;
      for (size_t i = 0; i < v.n && !found; i++) {
        const char *ti = ms_label(&v.s[i], "tier"), *st = ms_label(&v.s[i], "state");
        if (strcmp(v.s[i].name, "commitkv_kv_bytes") == 0 && ti && st && !strcmp(ti, tiers[t]) &&
            !strcmp(st, states[s])) {
          b = v.s[i].value;
          found = true;
        }
      }
      if (found)
        printf(" %20.0f", b);
      else
        printf(" %20s", "-");
    }
    putchar('\n');
  }
  double fp16 = mv_val(v, "commitkv_fp16_equivalent_bytes", NULL, NULL), total = 0;
  printf("  %-10s %14s", "total", "");
  for (int t = 0; t < nt; t++) {
    double b = mv_val(v, "commitkv_tier_bytes", "tier", tiers[t]);
    total += b;
    printf(" %20.0f", b);
  }
  printf("   (FP16 equivalent %.0f, ratio %.3f)\n", fp16, fp16 > 0 ? total / fp16 : 0.0);
  for (int t = 0; t < nt; t++)
    printf("  arena %s: %.0f of %.0f bytes used; hits %.0f, misses %.0f\n", tiers[t],
           mv_val(v, "commitkv_arena_used_bytes", "tier", tiers[t]),
           mv_val(v, "commitkv_arena_size_bytes", "tier", tiers[t]),
           mv_val(v, "commitkv_tier_hits_total", "tier", tiers[t]),
           mv_val(v, "commitkv_tier_misses_total", "tier", tiers[t]));
  printf("  transitions: draft->staged %.0f, staged->committed %.0f, ->recycled %.0f; recycles %.0f\n",
         mv_val(v, "commitkv_transitions_total", "kind", "draft_staged"),
         mv_val(v, "commitkv_transitions_total", "kind", "staged_committed"),
         mv_val(v, "commitkv_transitions_total", "kind", "any_recycled"),
         mv_val(v, "commitkv_recycles_total", NULL, NULL));
  print_histogram(v, "commitkv_report_round_duration_seconds", "ReportRound", "rounds", NULL);
  char pending[64];
  snprintf(pending, sizeof(pending), "; %.0f tokens pending", mv_val(v, "commitkv_compress_pending_tokens", NULL, NULL));
  print_histogram(v, "commitkv_compress_job_duration_seconds", "compression", "jobs", pending);
  printf("  errors:");
  int shown = 0;
  for (size_t i = 0; i < v.n; i++) {
    const char *code = ms_label(&v.s[i], "code");
    if (strcmp(v.s[i].name, "commitkv_errors_total") != 0 || !code || v.s[i].value == 0) continue;
    printf("%s %s %.0f", shown++ ? "," : "", code, v.s[i].value);
  }
  printf("%s\n", shown ? "" : " none");
}

static int cmd_metrics(int argc, char **argv, int first, const char *addr, int timeout_ms) {
  bool raw = false;
  for (int i = first; i < argc; i++) {
    if (strcmp(argv[i], "--raw") == 0) {
      raw = true;
    } else if (strcmp(argv[i], "--metrics") == 0 && i + 1 < argc) {
      addr = argv[++i];
    } else if (strncmp(argv[i], "--metrics=", 10) == 0) {
      addr = argv[i] + 10;
    } else {
      fprintf(stderr, "commitkvctl: metrics: unexpected argument '%s'\n", argv[i]);
      return 2;
    }
  }
  char *text = http_get_metrics(addr, timeout_ms > 0 ? timeout_ms : 5000);
  if (!text) return 1;
  if (raw) {
    fputs(text, stdout);
    free(text);
    return 0;
  }
  size_t cap = 256, n = 0, nt = 0, tcap = 16;
  msample *s = malloc(cap * sizeof(*s));
  const char **tenants = malloc(tcap * sizeof(*tenants));
  int rc = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line && s && tenants; line = strtok_r(NULL, "\n", &save)) {
    if (n == cap) {
      msample *ns = realloc(s, 2 * cap * sizeof(*s));
      if (!ns) break;
      s = ns;
      cap *= 2;
    }
    if (!ms_parse(line, &s[n])) continue;
    const char *t = ms_label(&s[n], "tenant");
    s[n].tenant = SIZE_MAX;
    if (t) {
      size_t k = nt;
      while (k > 0 && strcmp(tenants[k - 1], t) != 0) k--;
      if (k == 0) {
        if (nt == tcap) {
          const char **ntn = realloc(tenants, 2 * tcap * sizeof(*tenants));
          if (!ntn) break;
          tenants = ntn;
          tcap *= 2;
        }
        tenants[nt++] = t;
        k = nt;
      }
      s[n].tenant = k - 1;
    }
    n++;
  }
  if (!s || !tenants) {
    fprintf(stderr, "commitkvctl: metrics: out of memory\n");
    rc = 1;
  } else {
    mview all = {s, n};
    for (size_t i = 0; i < n; i++)
      if (strcmp(s[i].name, "commitkv_build_info") == 0) {
        const char *ver = ms_label(&s[i], "version"), *be = ms_label(&s[i], "backend"),
                   *tok = ms_label(&s[i], "boot_token");
        printf("commitkvd %s, backend %s, boot token %s", ver ? ver : "?", be ? be : "?", tok ? tok : "?");
        break;
      }
    printf(", up %.1f s (%s)\n", mv_val(all, "commitkv_uptime_seconds", NULL, NULL), addr);
    printf("clients %.0f, sessions %.0f; requests %.0f (%.0f errors), rounds %.0f, leases expired %.0f, "
           "attaches %.0f (%.0f refused)\n",
           mv_val(all, "commitkv_connected_clients", NULL, NULL), mv_val(all, "commitkv_open_sessions", NULL, NULL),
           mv_val(all, "commitkv_requests_total", NULL, NULL), mv_val(all, "commitkv_request_errors_total", NULL, NULL),
           mv_val(all, "commitkv_rounds_total", NULL, NULL), mv_val(all, "commitkv_leases_expired_total", NULL, NULL),
           mv_val(all, "commitkv_attaches_total", NULL, NULL), mv_val(all, "commitkv_attach_refused_total", NULL, NULL));
    printf("compressor: %.0f jobs queued, %.0f done, %.0f refused\n",
           mv_val(all, "commitkv_compress_queue_depth", NULL, NULL), mv_val(all, "commitkv_compress_jobs_total", NULL, NULL),
           mv_val(all, "commitkv_compress_refused_total", NULL, NULL));
    /* Group by tenant: one pass per tenant over the samples, copied into a
     * contiguous view (tenant counts are small next to sample counts). */
    msample *mine = malloc((n ? n : 1) * sizeof(*mine));
    for (size_t t = 0; mine && t < nt; t++) {
      if (tenants[t][0] == 0) continue; /* untenanted observations */
      size_t m = 0;
      for (size_t i = 0; i < n; i++)
        if (s[i].tenant == t) mine[m++] = s[i];
      print_tenant((mview){mine, m}, tenants[t]);
    }
    if (nt == 0) printf("\nno tenant has attached yet\n");
    free(mine);
  }
  free(tenants);
  free(s);
  free(text);
  return rc;
}

static void usage(FILE *out) {
  fprintf(out, "usage: commitkvctl [--socket ENDPOINT] [--attach-socket PATH] [--timeout MS] [--metrics ADDR] COMMAND\n"
               "commands:\n"
               "  status            daemon version, backend and why, uptime, sockets\n"
               "  sessions          sessions with their states and bytes\n"
               "  stats [--json]    totals (JSON: one object, DESIGN.md section 7)\n"
               "  drop ID [TENANT]  drop a session (another tenant's: admin only)\n"
               "  save ID [--committed-only] [--name NAME]\n"
               "                    write a session snapshot into the daemon's state directory\n"
               "  restore ID [--name NAME]\n"
               "                    bring a session back from its snapshot (then detached, for a worker to resume)\n"
               "  snapshots [--json] the saved sessions: id, tenant, tokens, bytes, model id/revision, time\n"
               "  metrics [--raw]   Prometheus figures per tenant from http://ADDR/metrics (default 127.0.0.1:9464)\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"socket", required_argument, 0, 's'},
                                       {"attach-socket", required_argument, 0, 'a'},
                                       {"timeout", required_argument, 0, 't'},
                                       {"json", no_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'},
                                       {"metrics", required_argument, 0, 'M'},
                                       {0, 0, 0, 0}};
  const char *metrics_addr = "127.0.0.1:9464";
  ckv_client_options o = {.name = "commitkvctl", .no_arenas = true, .timeout_ms = 5000};
  bool json = false;
  int ch;
  while ((ch = getopt_long(argc, argv, "+s:a:t:jh", opts, NULL)) != -1) {
    switch (ch) {
      case 's': o.socket = optarg; break;
      case 'a': o.attach_socket = optarg; break;
      case 't': o.timeout_ms = atoi(optarg); break;
      case 'j': json = true; break;
      case 'h': usage(stdout); return 0;
      case 'M': metrics_addr = optarg; break;
      default: usage(stderr); return 2;
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[optind++];
  /* metrics talks HTTP only: no attach, so it works without a tenant. */
  if (strcmp(cmd, "metrics") == 0) return cmd_metrics(argc, argv, optind, metrics_addr, o.timeout_ms);
  for (int i = optind; i < argc; i++)
    if (strcmp(argv[i], "--json") == 0) json = true;
  ckv_client *c;
  int r = ckv_client_connect(&o, &c);
  if (r < 0) {
    fprintf(stderr, "commitkvctl: cannot reach commitkvd: %s (%s): %s\n", ckv_strerror(r), ckv_status_name(r),
            ckv_client_connect_error());
    return 1;
  }
  int rc;
  if (strcmp(cmd, "stats") == 0)
    rc = cmd_stats(c, json);
  else if (strcmp(cmd, "status") == 0)
    rc = cmd_status(c);
  else if (strcmp(cmd, "sessions") == 0)
    rc = cmd_sessions(c);
  else if (strcmp(cmd, "drop") == 0 && optind < argc)
    rc = cmd_drop(c, argv[optind], optind + 1 < argc && strcmp(argv[optind + 1], "--json") ? argv[optind + 1] : NULL);
  else if (strcmp(cmd, "save") == 0 && optind < argc)
    rc = cmd_save(c, argv[optind], flag_value(argc, argv, optind + 1, "--name"),
                  has_flag(argc, argv, optind + 1, "--committed-only"));
  else if (strcmp(cmd, "restore") == 0 && optind < argc)
    rc = cmd_restore(c, argv[optind], flag_value(argc, argv, optind + 1, "--name"));
  else if (strcmp(cmd, "snapshots") == 0)
    rc = cmd_snapshots(c, json);
  else {
    usage(stderr);
    rc = 2;
  }
  ckv_client_free(c);
  return rc;
}
