/* coordinator/: `shardlm tokenize`. */
#ifndef SHARDLM_COORD_TOKCLI_H
#define SHARDLM_COORD_TOKCLI_H

/* argv[0] is "tokenize". Encodes TEXT (ids on one line) or decodes IDs (the text on one line)
 * with the tokenizer of any supported source. Returns the exit code: 0, 1 on failure, 2 on
 * bad usage. */
int coord_cmd_tokenize(int argc, char **argv);

#endif
