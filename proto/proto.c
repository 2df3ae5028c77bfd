/* SPDX-License-Identifier: MIT */
/* proto/proto.c: Envelope framing over ZeroMQ. */
#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

int proto_socket_setup(void *sock)
{
    int64_t max = PROTO_MAX_MSG;
    int linger = 0;
    if (zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof(max)) < 0 ||
        zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger)) < 0)
        return -zmq_errno();
    return 0;
}

/* zmq_send, again when a signal interrupts it: libzmq answers EINTR before it queues anything
 * (a signal that lands while it checks its command mailbox), so the frame is simply sent again.
 * The coordinator takes SIGTERM as "drain" and must not fail the step it is sending (a server's
 * running streams ended with "send Step to worker rank 0: Interrupted system call"). */
static int send_frame(void *sock, const void *buf, size_t n, int flags)
{
    while (zmq_send(sock, buf, n, flags) < 0)
        if (zmq_errno() != EINTR)
            return -zmq_errno();
    return 0;
}

/* zmq_msg_recv of a frame that poll said is there (or the rest of a message begun), again when
 * a signal interrupts it: a message's frames come together, so giving up between them would
 * leave the next receive to read its body as a new message. */
static int recv_frame(zmq_msg_t *m, void *sock)
{
    while (zmq_msg_recv(m, sock, 0) < 0)
        if (zmq_errno() != EINTR)
            return -zmq_errno();
    return 0;
}

int proto_send(void *sock, const void *id, size_t idlen, const proto_env *env)
{
    size_t n = shardlm__envelope__get_packed_size(env);
    uint8_t stackbuf[512], *buf = n <= sizeof(stackbuf) ? stackbuf : malloc(n);
    if (!buf)
        return -ENOMEM;
    shardlm__envelope__pack(env, buf);
    int rc = id ? send_frame(sock, id, idlen, ZMQ_SNDMORE) : 0;
    if (!rc)
        rc = send_frame(sock, buf, n, 0);
    if (buf != stackbuf)
        free(buf);
    return rc;
}

/* Drops the rest of a multi-part message. */
static void drain(void *sock)
{
    int more = 1;
    size_t sz = sizeof(more);
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sock, 0);
        zmq_msg_close(&m);
    }
}

int proto_recv(void *sock, int timeout_ms, void *id, size_t *idlen, proto_env **out)
{
    *out = NULL;
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    int n = zmq_poll(&it, 1, timeout_ms);
    if (n < 0)
        return -zmq_errno();
    if (n == 0)
        return -EAGAIN;
    zmq_msg_t m;
    zmq_msg_init(&m);
    int rc;
    if (id) {
        if ((rc = recv_frame(&m, sock))) {
            zmq_msg_close(&m);
            return rc;
        }
        size_t len = zmq_msg_size(&m);
        *idlen = len < PROTO_MAX_ID ? len : PROTO_MAX_ID;
        memcpy(id, zmq_msg_data(&m), *idlen);
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more)
            return -EBADMSG;
        zmq_msg_init(&m);
    }
    if ((rc = recv_frame(&m, sock))) {
        zmq_msg_close(&m);
        return rc;
    }
    if (zmq_msg_more(&m)) { /* one frame only */
        drain(sock);
        rc = -EBADMSG;
    } else {
        *out = shardlm__envelope__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
        if (!*out)
            rc = -EBADMSG;
        else if ((*out)->msg_case == SHARDLM__ENVELOPE__MSG__NOT_SET) {
            proto_free(*out);
            *out = NULL;
            rc = -EBADMSG;
        }
    }
    zmq_msg_close(&m);
    return rc;
}

void proto_free(proto_env *env)
{
    if (env)
        shardlm__envelope__free_unpacked(env, NULL);
}

const char *proto_case_name(const proto_env *env)
{
    switch (env->msg_case) {
    case SHARDLM__ENVELOPE__MSG_HELLO:
        return "Hello";
    case SHARDLM__ENVELOPE__MSG_ATTACH:
        return "Attach";
    case SHARDLM__ENVELOPE__MSG_READY:
        return "Ready";
    case SHARDLM__ENVELOPE__MSG_STEP:
        return "Step";
    case SHARDLM__ENVELOPE__MSG_STEP_DONE:
        return "StepDone";
    case SHARDLM__ENVELOPE__MSG_HEARTBEAT:
        return "Heartbeat";
    case SHARDLM__ENVELOPE__MSG_SHUTDOWN:
        return "Shutdown";
    case SHARDLM__ENVELOPE__MSG_ERROR:
        return "Error";
    case SHARDLM__ENVELOPE__MSG_REJOIN:
        return "Rejoin";
    default:
        return "unknown";
    }
}

int proto_key_read(const char *path, char *pub, char *sec)
{
    /* O_NONBLOCK: a FIFO must not make this wait for a writer; only a regular file is a key */
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -EINVAL;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return -ENOMEM;
    }
    char line[128], p[64] = "", s[64] = "";
    while (fgets(line, sizeof(line), f)) {
        char key[16], val[64];
        if (sscanf(line, "%15s %63s", key, val) != 2)
            continue;
        if (!strcmp(key, "public"))
            snprintf(p, sizeof(p), "%s", val);
        else if (!strcmp(key, "secret"))
            snprintf(s, sizeof(s), "%s", val);
    }
    fclose(f);
    uint8_t bin[32];
    if (strlen(p) != 40 || !zmq_z85_decode(bin, p) ||
        (sec && (strlen(s) != 40 || !zmq_z85_decode(bin, s))))
        return -EINVAL;
    memcpy(pub, p, 41);
    if (sec)
        memcpy(sec, s, 41);
    return 0;
}

int proto_curve_client(void *sock, const char *server_pub, const char *pub, const char *sec)
{
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_pub, 40) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 40) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 40) < 0)
        return -zmq_errno();
    return 0;
}
