/* SPDX-License-Identifier: MIT */
/* coordinator/server/notify.h: readiness for a service manager - sd_notify(3)'s datagram
 * protocol, written anew (no libsystemd). systemd's Type=notify waits for "READY=1" on the
 * AF_UNIX datagram socket named by $NOTIFY_SOCKET before it calls the unit started.
 *
 * The protocol speaks for a process (NotifyAccess=main accepts the main PID only), so the
 * notifier is the process's: the CLI, which owns the environment, opens it once; the server
 * sends its state changes through it. Nothing here is ever fatal: a manager that is gone or a
 * full queue loses a status line, never the server. */
#ifndef SHARDLM_COORD_NOTIFY_H
#define SHARDLM_COORD_NOTIFY_H

/* Sends the process's notifications from now on to @addr, $NOTIFY_SOCKET's value: a socket's
 * path, or '@' and an abstract name. NULL or "": none (coord_notify() does nothing). Returns 0,
 * -EINVAL for an address that is neither (too long, relative), or socket(2)'s -errno; on an
 * error coord_notify() does nothing, and the caller may go on. Called before any thread
 * notifies; coord_notify_close() ends it. */
int coord_notify_open(const char *addr);

/* Sends one datagram: newline-separated assignments ("READY=1\nSTATUS=serving"), printf-style,
 * truncated at 512 bytes. Errors are ignored. */
void coord_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Closes the socket; coord_notify() does nothing after it. */
void coord_notify_close(void);

#endif
