/* SPDX-License-Identifier: MIT */
/* coordinator/engine/access.c: endpoints, CURVE keys and the ZAP handler. */
#include "access.h"

#include "proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static int write_key(const char *dir, const char *name, struct shardlm_err *e)
{
    char path[4200], pub[41], sec[41], text[128];
    if (zmq_curve_keypair(pub, sec) < 0)
        return shardlm_fail(e, -zmq_errno(), "CURVE key pair: %s (libzmq without CURVE?)",
                            zmq_strerror(zmq_errno()));
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return shardlm_fail(e, -errno, "%s: %s%s", path, strerror(errno),
                            errno == EEXIST ? " (keys are never overwritten: remove them first)"
                                            : "");
    int n = snprintf(text, sizeof(text), "public %s\nsecret %s\n", pub, sec);
    if (write(fd, text, (size_t)n) != n) {
        int err = errno;
        close(fd);
        unlink(path);
        return shardlm_fail(e, -err, "%s: write: %s", path, strerror(err));
    }
    close(fd);
    return 0;
}

int coord_keygen(const char *dir, struct shardlm_err *e)
{
    struct stat st;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return shardlm_fail(e, -errno, "%s: %s", dir, strerror(errno));
    if (stat(dir, &st) < 0)
        return shardlm_fail(e, -errno, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return shardlm_fail(e, -ENOTDIR,
                            "%s: exists and is not a directory (-o names the folder that "
                            "receives the keys)",
                            dir);
    if (st.st_mode & 077)
        return shardlm_fail(e, -EPERM,
                            "%s: not a private directory (mode 0700): the secret keys "
                            "would be readable by others",
                            dir);
    int rc = write_key(dir, COORD_KEY_SERVER, e);
    if (!rc && (rc = write_key(dir, COORD_KEY_WORKER, e))) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, COORD_KEY_SERVER);
        unlink(path);
    }
    return rc;
}

/* Whether @host (no brackets) is a loopback address: 127.0.0.0/8, ::1 or localhost. */
static bool is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcmp(host, "localhost"))
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

int coord_listen_endpoint(const char *listen, char *out, size_t len, bool *loopback,
                          struct shardlm_err *e)
{
    if (!strcmp(listen, "tcp")) {
        snprintf(out, len, "tcp://127.0.0.1:0");
        *loopback = true;
        return 0;
    }
    char host[256];
    const char *p = listen + 6, *colon = strrchr(listen, ':');
    long port;
    if (strncmp(listen, "tcp://", 6) || !colon || colon < p ||
        !coord_parse_long(colon + 1, 0, 65535, &port) || (size_t)(colon - p) >= sizeof(host) ||
        colon == p)
        return shardlm_fail(e, -EINVAL, "--listen '%s': expected tcp or tcp://HOST:PORT", listen);
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') { /* [::1] */
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    *loopback = is_loopback(host);
    snprintf(out, len, "%s", listen);
    return 0;
}

struct coord_curve {
    pthread_t th;
    void *zap;
    char worker_pub[41];
    const struct coord_log *log;
};

/* ZAP (RFC 27): each CURVE handshake asks here; only the worker key gets 200. */
static void *zap_run(void *arg)
{
    struct coord_curve *c = arg;
    uint8_t want[32];
    zmq_z85_decode(want, c->worker_pub);
    for (;;) {
        char frames[8][256];
        size_t sizes[8];
        int n = 0, more = 1;
        while (more) {
            int got = zmq_recv(c->zap, n < 8 ? frames[n] : frames[7], 255, 0);
            if (got < 0) {
                if (zmq_errno() == EINTR)
                    continue;
                zmq_close(c->zap); /* ETERM: the context is going */
                return NULL;
            }
            if (n < 8)
                sizes[n++] = (size_t)(got < 255 ? got : 255);
            size_t ml = sizeof(more);
            zmq_getsockopt(c->zap, ZMQ_RCVMORE, &more, &ml);
        }
        /* version, request id, domain, address, identity, mechanism, client key */
        bool ok = n >= 7 && sizes[5] == 5 && !memcmp(frames[5], "CURVE", 5) && sizes[6] == 32 &&
                  !memcmp(frames[6], want, 32);
        if (!ok) {
            char addr[256] = "?", key[41] = "?";
            if (n >= 4)
                snprintf(addr, sizeof(addr), "%.*s", (int)sizes[3], frames[3]);
            if (n >= 7 && sizes[6] == 32)
                zmq_z85_encode(key, (uint8_t *)frames[6], 32);
            coord_logf(c->log, COORD_LOG_WARN,
                       "refused a peer from %s: its CURVE key %s is not the workers' key", addr,
                       key);
        }
        zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(c->zap, frames[1], n >= 2 ? sizes[1] : 0, ZMQ_SNDMORE);
        zmq_send(c->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        zmq_send(c->zap, ok ? "OK" : "unknown key", ok ? 2 : 11, ZMQ_SNDMORE);
        zmq_send(c->zap, "worker", ok ? 6 : 0, ZMQ_SNDMORE);
        zmq_send(c->zap, "", 0, 0);
    }
}

/* proto_key_read with the message: the file's kind when it is not a regular file. */
static int read_key(const char *dir, const char *path, char *pub, char *sec, struct shardlm_err *e)
{
    struct stat st;
    struct shardlm_err why;
    int fd = coord_open_regular(path, &st, &why);
    if (fd < 0)
        return shardlm_fail(e, fd, "--keys %s: %s", dir, why.msg);
    close(fd);
    int rc = proto_key_read(path, pub, sec);
    if (rc)
        return shardlm_fail(e, rc, "--keys %s: %s: %s", dir, path,
                            rc == -EINVAL ? "not a key file of `shardlm keygen`" : strerror(-rc));
    return 0;
}

int coord_curve_start(struct coord_curve **out, void *zctx, void *sock, const char *dir,
                      const struct coord_log *log, struct shardlm_err *e)
{
    char path[4200], spub[41], ssec[41];
    struct coord_curve *c = calloc(1, sizeof(*c));
    int rc, one = 1;
    *out = NULL;
    if (!c)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    c->log = log;
    snprintf(path, sizeof(path), "%s/%s", dir, COORD_KEY_SERVER);
    if ((rc = read_key(dir, path, spub, ssec, e))) {
        free(c);
        return rc;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, COORD_KEY_WORKER);
    if ((rc = read_key(dir, path, c->worker_pub, NULL, e))) {
        free(c);
        return rc;
    }
    c->zap = zmq_socket(zctx, ZMQ_REP);
    if (!c->zap || zmq_bind(c->zap, "inproc://zeromq.zap.01") < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) < 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, ssec, 40) < 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "shardlm", 7) < 0) {
        rc = shardlm_fail(e, -zmq_errno(), "CURVE server: %s", zmq_strerror(zmq_errno()));
        if (c->zap)
            zmq_close(c->zap);
        free(c);
        return rc;
    }
    /* the handler's thread takes no signal (SIGTERM and the like go to the others): its replies
     * are six frames sent unchecked, and an interrupted one would leave a handshake waiting */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&c->th, NULL, zap_run, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        zmq_close(c->zap);
        free(c);
        return shardlm_fail(e, -rc, "ZAP handler thread: %s", strerror(rc));
    }
    *out = c;
    return 0;
}

void coord_curve_stop(struct coord_curve *c)
{
    if (!c)
        return;
    pthread_join(c->th, NULL);
    free(c);
}
