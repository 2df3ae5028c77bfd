# SPDX-License-Identifier: MIT
# Writes OUT, a C file holding the bytes of IN as `const unsigned char SYM[]` (NUL-terminated)
# and `const size_t SYM_len`: files served by the binary (the web page) without a build step.
#   cmake -DIN=page.html -DOUT=page.c -DSYM=coord_page -P cmake/embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR n "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
get_filename_component(name "${IN}" NAME)
file(WRITE "${OUT}" "/* generated from ${name} by cmake/embed.cmake: do not edit */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${SYM}[] = {${bytes} 0};\n"
  "const size_t ${SYM}_len = ${n};\n")
