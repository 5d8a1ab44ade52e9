/*
 * fileio.c - shared file helpers for the atomic writers (see fileio.h).
 */
#include "io/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

zs_status zsi_write_all(int fd, const void *buf, size_t n, const char *path,
                        const char *what)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return zs_set_error_code(ZS_ERR_IO, "%s: writing %s: %s", what, path,
                                     strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return ZS_OK;
}

void zsi_fsync_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
}
