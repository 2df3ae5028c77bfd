/* SPDX-License-Identifier: MIT */
/* coordinator/cli/signals.c: SIGINT and SIGTERM, which set the engine's cancel flag. */
#include "cli.h"

#include <signal.h>

volatile sig_atomic_t coord_stop_signal;

static void on_signal(int sig) { coord_stop_signal = sig; }

void coord_signals_install(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_signal; /* no SA_RESTART: waits wake up and see the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
