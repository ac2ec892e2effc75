/* commitkvctl - the administrator's view of a running commitkvd.
 *
 *   commitkvctl [--socket ENDPOINT] [--attach-socket PATH] COMMAND
 *     status            daemon version, backend (and why), uptime, sockets
 *     sessions          one line per session (this tenant's; every tenant's for an admin)
 *     stats [--json]    totals; --json prints one JSON object (DESIGN.md §7)
 *     drop ID [TENANT]  drop a session (TENANT: admin only)
 *
 * It attaches like a worker, without mapping arenas. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  printf("{\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64 ", \"recycled\": %" PRIu64 "}",
         t ? t->draft : 0, t ? t->staged : 0, t ? t->committed : 0, t ? t->recycled : 0);
}

static void json_bytes(const Commitkv__V1__ByteCounts *b) {
  printf("{\"draft\": %" PRIu64 ", \"staged\": %" PRIu64 ", \"committed\": %" PRIu64 ", \"total\": %" PRIu64
         ", \"fp16_equivalent\": %" PRIu64 "}",
         b ? b->draft : 0, b ? b->staged : 0, b ? b->committed : 0, b ? b->total : 0, b ? b->fp16_equivalent : 0);
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
      printf(", \"arena_id\": %u, \"bytes_total\": %" PRIu64 ", \"bytes_used\": %" PRIu64 "}", s->arenas[i]->arena_id,
             s->arenas[i]->bytes_total, s->arenas[i]->bytes_used);
    }
    printf("], \"tenants\": [");
    for (size_t i = 0; i < s->n_tenants; i++) {
      const Commitkv__V1__TenantStats *t = s->tenants[i];
      printf("%s{\"name\": ", i ? ", " : "");
      json_str(t->name);
      printf(", \"sessions\": %" PRIu64 ", \"clients\": %" PRIu64 ", \"quota_bytes\": %" PRIu64 ", \"tokens\": ",
             t->sessions, t->clients, t->quota_bytes);
      json_tokens(t->tokens);
      printf(", \"bytes\": ");
      json_bytes(t->bytes);
      printf("}");
    }
    printf("], \"detached_sessions\": %" PRIu64 ", \"leases_expired\": %" PRIu64 ", \"requests\": %" PRIu64
           ", \"errors\": %" PRIu64 ", \"rounds\": %" PRIu64 ", \"uptime_ms\": %" PRIu64 ", \"backend\": ",
           s->detached_sessions, s->leases_expired, s->requests, s->errors, s->rounds, s->uptime_ms);
    json_str(s->backend);
    printf("}\n");
  } else {
    const Commitkv__V1__ByteCounts *b = s->bytes;
    const Commitkv__V1__TokenCounts *t = s->tokens;
    printf("sessions %" PRIu64 " (%" PRIu64 " detached), clients %" PRIu64 ", backend %s\n", s->sessions,
           s->detached_sessions, s->clients, s->backend);
    printf("%-10s %14s %16s\n", "state", "tokens", "bytes");
    printf("%-10s %14" PRIu64 " %16" PRIu64 "\n", "draft", t->draft, b->draft);
    printf("%-10s %14" PRIu64 " %16" PRIu64 "\n", "staged", t->staged, b->staged);
    printf("%-10s %14" PRIu64 " %16" PRIu64 "\n", "committed", t->committed, b->committed);
    printf("%-10s %14" PRIu64 " %16s\n", "recycled", t->recycled, "-");
    printf("%-10s %14s %16" PRIu64 "  (FP16 equivalent %" PRIu64 ", ratio %.3f)\n", "total", "", b->total,
           b->fp16_equivalent, b->fp16_equivalent ? (double)b->total / (double)b->fp16_equivalent : 0.0);
    for (size_t i = 0; i < s->n_arenas; i++)
      printf("arena %u (%s, tenant %s): %" PRIu64 " of %" PRIu64 " bytes used\n", s->arenas[i]->arena_id,
             s->arenas[i]->kind, s->arenas[i]->tenant, s->arenas[i]->bytes_used, s->arenas[i]->bytes_total);
    printf("requests %" PRIu64 ", errors %" PRIu64 ", rounds %" PRIu64 ", leases expired %" PRIu64 "\n", s->requests,
           s->errors, s->rounds, s->leases_expired);
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
  printf("%-24s %-10s %-9s %-8s %8s %8s %8s %8s %12s %7s\n", "session", "tenant", "policy", "attached", "draft",
         "staged", "commit", "recycled", "bytes", "vs_fp16");
  for (size_t i = 0; i < l->n_sessions; i++) {
    const Commitkv__V1__SessionInfo *s = l->sessions[i];
    double ratio = s->bytes->fp16_equivalent ? (double)s->bytes->total / (double)s->bytes->fp16_equivalent : 0.0;
    printf("%-24s %-10s %-9s %-8s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %12" PRIu64 " %7.3f\n",
           s->session_id, s->tenant, s->policy, s->attached ? "yes" : "no", s->tokens->draft, s->tokens->staged,
           s->tokens->committed, s->tokens->recycled, s->bytes->total, ratio);
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

static void usage(FILE *out) {
  fprintf(out, "usage: commitkvctl [--socket ENDPOINT] [--attach-socket PATH] [--timeout MS] COMMAND\n"
               "commands:\n"
               "  status            daemon version, backend and why, uptime, sockets\n"
               "  sessions          sessions with their states and bytes\n"
               "  stats [--json]    totals (JSON: one object, DESIGN.md section 7)\n"
               "  drop ID [TENANT]  drop a session (another tenant's: admin only)\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"socket", required_argument, 0, 's'},
                                       {"attach-socket", required_argument, 0, 'a'},
                                       {"timeout", required_argument, 0, 't'},
                                       {"json", no_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
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
      default: usage(stderr); return 2;
    }
  }
  if (optind >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[optind++];
  for (int i = optind; i < argc; i++)
    if (strcmp(argv[i], "--json") == 0) json = true;
  ckv_client *c;
  int r = ckv_client_connect(&o, &c);
  if (r < 0) return fail(NULL, "cannot reach commitkvd", r);
  int rc;
  if (strcmp(cmd, "stats") == 0)
    rc = cmd_stats(c, json);
  else if (strcmp(cmd, "status") == 0)
    rc = cmd_status(c);
  else if (strcmp(cmd, "sessions") == 0)
    rc = cmd_sessions(c);
  else if (strcmp(cmd, "drop") == 0 && optind < argc)
    rc = cmd_drop(c, argv[optind], optind + 1 < argc && strcmp(argv[optind + 1], "--json") ? argv[optind + 1] : NULL);
  else {
    usage(stderr);
    rc = 2;
  }
  ckv_client_free(c);
  return rc;
}
