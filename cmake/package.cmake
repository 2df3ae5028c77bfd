# SPDX-License-Identifier: MIT
# The Debian package: `cpack -G DEB` in a build configured with -DCMAKE_INSTALL_PREFIX=/usr
# (deploy/package.sh does it all and runs lintian). Depends are read off the libraries the binaries
# actually link (dpkg-shlibdeps, from dpkg-dev); the maintainer scripts and the copyright and
# changelog files are in deploy/debian/.
# The package's version: the project's, and for a build from git the commits since the start and
# the commit (0.1.0+git412.cb668aaf4664), so that every commit's package upgrades the one before
execute_process(COMMAND git -C "${CMAKE_SOURCE_DIR}" rev-parse --show-toplevel
  OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(SHARDLM_DEB_VERSION ${PROJECT_VERSION})
string(TIMESTAMP SHARDLM_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
if(top AND top STREQUAL CMAKE_SOURCE_DIR) # not the repository of a folder we are unpacked in
  execute_process(COMMAND git -C "${CMAKE_SOURCE_DIR}" rev-list --count HEAD
    OUTPUT_VARIABLE commits OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  execute_process(COMMAND git -C "${CMAKE_SOURCE_DIR}" log -1 --abbrev=12 "--date=format:%a, %d %b %Y %H:%M:%S %z"
    --format=%h%x20%ad
    OUTPUT_VARIABLE hd OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(commits AND hd MATCHES "^([0-9a-f]+) (.*)$")
    set(SHARDLM_DEB_VERSION ${PROJECT_VERSION}+git${commits}.${CMAKE_MATCH_1})
    set(SHARDLM_DEB_DATE "${CMAKE_MATCH_2}") # the commit's: the same package from the same commit
  endif()
endif()
configure_file(${CMAKE_SOURCE_DIR}/deploy/debian/changelog.in ${CMAKE_BINARY_DIR}/changelog @ONLY)

set(CPACK_PACKAGE_NAME shardlm)
set(CPACK_DEBIAN_PACKAGE_VERSION ${SHARDLM_DEB_VERSION})
set(CPACK_PACKAGE_VENDOR "the shardlm authors")
set(CPACK_PACKAGE_CONTACT "shardlm maintainers <maintainers@shardlm.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "serve language models on CPU servers from 4-bit weights")
# the long description: CPack puts the summary above it and indents it as control files want
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "shardlm runs decoder-only language models (Llama and its relatives) on x86
servers, multi-socket Xeons above all, from 4-bit weights. A coordinator
maps the weights once into NUMA-local shared memory and drives one worker
process per NUMA node (AMX, AVX-512 or AVX2 kernels). shardlm serve is an
OpenAI-compatible HTTP server with continuous batching and a paged KV cache.

This package holds the shardlm command, its worker, a systemd unit per
served model (shardlm@.service), an example HAProxy configuration and a
tiny bundled model (stories260K) for a first run.")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # shardlm_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS adduser) # postinst's fallback where systemd-sysusers is absent
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF) # no shared library of ours
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${CMAKE_SOURCE_DIR}/deploy/debian/postinst ${CMAKE_SOURCE_DIR}/deploy/debian/prerm
  ${CMAKE_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON) # maintainer scripts 0755, files 0644
set(CPACK_GENERATOR DEB)
include(CPack)
