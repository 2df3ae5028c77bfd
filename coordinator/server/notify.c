/* SPDX-License-Identifier: MIT */
/* coordinator/server/notify.c: sd_notify(3)'s protocol without libsystemd - one datagram per
 * state change to $NOTIFY_SOCKET (systemd.service(5), Type=notify; sd_notify(3), "Notes"). */
#include "notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define NOTIFY_MAX 512 /* bytes of one message: a few short assignments */

/* The process's notifier (notify.h says why one per process): fd -1 until opened. */
static struct {
    int fd;
    struct sockaddr_un sa;
    socklen_t len;
} nt = {.fd = -1};

int coord_notify_open(const char *addr)
{
    coord_notify_close();
    if (!addr || !*addr)
        return 0;
    size_t n = strlen(addr);
    if ((addr[0] != '/' && addr[0] != '@') || n >= sizeof(nt.sa.sun_path))
        return -EINVAL;
    memset(&nt.sa, 0, sizeof(nt.sa));
    nt.sa.sun_family = AF_UNIX;
    memcpy(nt.sa.sun_path, addr, n);
    if (addr[0] == '@') /* abstract: a leading NUL, and the length says where the name ends */
        nt.sa.sun_path[0] = '\0';
    nt.len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (addr[0] == '/'));
    /* close-on-exec: the workers never hold it (and NotifyAccess=main would drop what they
     * sent) */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    nt.fd = fd;
    return 0;
}

void coord_notify(const char *fmt, ...)
{
    if (nt.fd < 0)
        return;
    char msg[NOTIFY_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(msg))
        n = (int)sizeof(msg) - 1;
    /* sendto, not connect once: a manager that re-executes binds its socket anew, and a
     * connected socket would keep pointing at the old one. Blocking, as libsystemd's is: the
     * manager reads its socket at once, and a READY=1 lost to a full queue would time the
     * unit's start out. */
    while (sendto(nt.fd, msg, (size_t)n, MSG_NOSIGNAL, (const struct sockaddr *)&nt.sa, nt.len) <
               0 &&
           errno == EINTR)
        ;
}

void coord_notify_close(void)
{
    if (nt.fd >= 0)
        close(nt.fd);
    nt.fd = -1;
}
