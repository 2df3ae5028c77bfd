/* SPDX-License-Identifier: MIT */
/* coordinator/engine/access.h: who may talk to the coordinator's socket. */

/* By default the socket is an ipc endpoint in the private runtime directory (0700, the socket
 * file 0600). `--listen tcp` binds 127.0.0.1 on a free port instead, `--listen tcp://HOST:PORT`
 * the given address; an address that is not loopback needs CURVE keys (`--keys DIR`, made by
 * `shardlm keygen -o DIR`): the socket is then a CURVE server, and a ZAP handler admits only
 * peers with the workers' key, refusing and logging the others. */
#ifndef SHARDLM_COORD_ACCESS_H
#define SHARDLM_COORD_ACCESS_H

#include "log.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>

#define COORD_KEY_SERVER "server.key"
#define COORD_KEY_WORKER "worker.key"

/* Writes DIR/server.key and DIR/worker.key (0600; DIR made 0700 if missing). */
int coord_keygen(const char *dir, struct shardlm_err *e);

/* The address to bind for --listen @listen (NULL: none, the ipc default), into @out; whether it
 * is loopback. -EINVAL with @e set for anything but tcp://HOST:PORT or "tcp". */
int coord_listen_endpoint(const char *listen, char *out, size_t len, bool *loopback,
                          struct shardlm_err *e);

/* A CURVE server on @sock (before bind) with the keys of @dir, and its ZAP handler in a thread
 * of @zctx admitting only the worker key; each peer it refuses is a COORD_LOG_WARN line to @log
 * (from that thread; @log must outlive the handler). Release with coord_curve_stop() after the
 * context terminates. */
struct coord_curve;
int coord_curve_start(struct coord_curve **out, void *zctx, void *sock, const char *dir,
                      const struct coord_log *log, struct shardlm_err *e);
/* Joins the handler (call after zmq_ctx_term: that ends it) and frees it. NULL is fine. */
void coord_curve_stop(struct coord_curve *c);

#endif
