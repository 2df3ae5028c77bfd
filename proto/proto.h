/* SPDX-License-Identifier: MIT */
/* proto/proto.h: framing of the protobuf-c Envelope over ZeroMQ sockets.
 * A DEALER sends and receives one frame; a ROUTER prefixes the peer's routing id. */
#ifndef SHARDLM_PROTO_H
#define SHARDLM_PROTO_H

#include "shardlm.pb-c.h"

#include <stddef.h>

#define PROTO_VERSION 2
#define PROTO_MAX_MSG (1 << 20) /* bytes; set as ZMQ_MAXMSGSIZE on every socket */
#define PROTO_MAX_ID 64

typedef Shardlm__Envelope proto_env;

/* Packs @env and sends it; @id (ROUTER peers) may be NULL. Returns 0 or -errno (a signal that
 * interrupts it is not an error: the send is retried). */
int proto_send(void *sock, const void *id, size_t idlen, const proto_env *env);
/* Receives one message, waiting at most @timeout_ms (-1: forever). With a ROUTER the peer's id
 * goes to @id (PROTO_MAX_ID bytes) and its length to *@idlen; pass NULL for a DEALER.
 * Returns 0 and *@out (free with proto_free), -EAGAIN on timeout, -EINTR when a signal
 * interrupts the wait (before any frame is taken: once one is, the message is read whole),
 * -EBADMSG for a frame that is not an Envelope with a message set (it is consumed), or -errno. */
int proto_recv(void *sock, int timeout_ms, void *id, size_t *idlen, proto_env **out);
void proto_free(proto_env *env);
/* Sets the options every shardlm socket carries (max message size, linger 0). */
int proto_socket_setup(void *sock);

/* CURVE key files (`shardlm keygen`): two lines, "public <z85>" and "secret <z85>" (40 chars
 * each). Reads @path into @pub and, when @sec is not NULL, @sec (41 bytes each, NUL-terminated).
 * Returns 0, -errno, or -EINVAL for a file that is not one. */
int proto_key_read(const char *path, char *pub, char *sec);
/* Makes @sock a CURVE client of the server whose public key is @server_pub, as @pub/@sec. */
int proto_curve_client(void *sock, const char *server_pub, const char *pub, const char *sec);
/* A name for the message case, for logs. */
const char *proto_case_name(const proto_env *env);

#endif
