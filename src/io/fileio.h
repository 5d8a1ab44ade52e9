/*
 * io/fileio.h - small file helpers shared by the writers of src/io (they
 * all write atomically: temporary file, fsync, rename, fsync of the
 * directory).
 */
#ifndef ZS_IO_FILEIO_H
#define ZS_IO_FILEIO_H

#include <stddef.h>

#include "zs/core.h"

/* Writes n bytes to fd, retrying short writes and EINTR; on failure a
 * message "<what>: writing <path>: <reason>". */
zs_status zsi_write_all(int fd, const void *buf, size_t n, const char *path,
                        const char *what);
/* fsync of the directory holding path, so a rename into it is durable.
 * Best effort: errors are ignored. */
void zsi_fsync_dir(const char *path);

#endif
