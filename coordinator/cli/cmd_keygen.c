/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_keygen.c: `shardlm keygen` - CURVE keys for workers off loopback. */
#include "access.h"
#include "cli.h"

#include <getopt.h>
#include <stdio.h>

int coord_cmd_keygen(int argc, char **argv)
{
    static const char usage[] =
        "usage: shardlm keygen -o DIR\n"
        "\n"
        "Writes a CURVE key pair for the coordinator (DIR/server.key) and one for its workers\n"
        "(DIR/worker.key), 0600 in a 0700 DIR. `--listen tcp://HOST:PORT --keys DIR` then\n"
        "encrypts the control connection and admits only workers holding DIR/worker.key; an\n"
        "address other than loopback requires it.\n";
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {{'o', "-o"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"keygen", usage, "o:h", opts, paths};
    const char *dir = NULL;
    int c, rc;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        if (c == COORD_CLI_EXIT)
            return rc;
        if (c == 'o')
            dir = optarg;
    }
    if (optind != argc)
        return coord_usage_error("keygen", usage, "unexpected argument '%s'", argv[optind]);
    if (!dir)
        return coord_usage_error("keygen", usage, "-o DIR is required");
    struct shardlm_err e;
    if (coord_keygen(dir, &e)) {
        fprintf(stderr, "shardlm keygen: %s\n", e.msg);
        return 1;
    }
    printf("wrote %s/%s and %s/%s\n", dir, COORD_KEY_SERVER, dir, COORD_KEY_WORKER);
    return 0;
}
