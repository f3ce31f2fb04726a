/* cuse_floor: the floor for the frontend-proxy benchmark (tests/bench/run-bench.sh).
 *
 * A minimal CUSE device on libfuse3's lowlevel CUSE API (cuse_lowlevel_setup + the
 * multi-threaded session loop), with unrestricted ioctls, that does as little work as possible
 * per request. Command `_IO('B', n)`, n = 1..8, is answered in exactly n CUSE round trips:
 *
 *   round 1 (no data)            n == 1: reply 0, no data.
 *                                else  : retry, asking for the 32-byte top struct (in and out).
 *   round 2 (top struct)         n == 2: reply 0 with the top struct echoed back.
 *                                else  : retry, asking for top + the buffer at top.ptr
 *                                        (top.size bytes), in and out.
 *   round 3 (top + buffer)       n == 3: reply 0 with top + buffer echoed back.
 *                                else  : retry, asking also for the nested buffer whose
 *                                        address and size are the first 12 bytes of the buffer.
 *   round 4 (top + buf + nested) n == 4: reply 0 with everything echoed back.
 *                                else  : retry, asking also for the nested buffer's first byte.
 *   round k > 4                  the same plus one byte more each round (the round is known
 *                                from the input size), until round n replies with everything
 *                                echoed back. These rounds stand for a server that needs more
 *                                round trips than levels of pointers.
 *
 * The top struct has the layout of NVOS54_PARAMETERS (the RM_CONTROL payload): pointer at
 * offset 16, size at offset 24, so a floor3 ioctl moves the same bytes as an RM_CONTROL does
 * through a proxy that uses FUSE_IOCTL_RETRY. Any other command gets ENOTTY.
 *
 * Usage: cuse_floor [--name DEVNAME] [--single]
 *   Registers /dev/DEVNAME (default nvbench-floor); prints "READY /dev/DEVNAME" on stdout once
 *   the node exists. --single uses the single-threaded loop instead of the multi-threaded one.
 *   Runs until killed (SIGTERM/SIGINT end the loop cleanly).
 * Build: gcc -O2 -Wall -o cuse_floor cuse_floor.c $(pkg-config --cflags --libs fuse3)
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE
#include <cuse_lowlevel.h>
#include <fuse_lowlevel.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define FLOOR_TYPE 'B'
#define FLOOR_MAX_ROUNDS 8
#define FLOOR_MAX_BUF (64u * 1024u)

/* Same layout as NVOS54_PARAMETERS: 32 bytes, ptr at 16, size at 24. */
struct floor_top {
    uint32_t a, b, c, d;
    uint64_t ptr;
    uint32_t size;
    uint32_t status;
};
_Static_assert(sizeof(struct floor_top) == 32, "top struct is 32 bytes");

/* The first 12 bytes of the buffer at top.ptr, read in round 3 of a 4-round command. */
struct floor_nested {
    uint64_t ptr;
    uint32_t size;
};
#define FLOOR_NESTED_HDR 12u

static char devpath[160];

static void floor_open(fuse_req_t req, struct fuse_file_info *fi)
{
    fi->direct_io = 1;
    fi->nonseekable = 1;
    fuse_reply_open(req, fi);
}

static void floor_init_done(void *userdata)
{
    (void)userdata;
    /* The kernel creates the node while it handles our INIT reply; make sure before saying so. */
    struct stat sb;
    for (int i = 0; i < 200 && stat(devpath, &sb) != 0; i++)
        usleep(10000);
    printf("READY %s\n", devpath);
    fflush(stdout);
}

/* Asks for `n` input iovecs and the same `n` as output iovecs. */
static void retry(fuse_req_t req, const struct iovec *iov, size_t n)
{
    fuse_reply_ioctl_retry(req, iov, n, iov, n);
}

static void floor_ioctl(fuse_req_t req, int cmd, void *arg, struct fuse_file_info *fi,
                        unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
    (void)fi;
    (void)out_bufsz;
    unsigned c = (unsigned)cmd;
    unsigned rounds = c & 0xff;
    if ((flags & FUSE_IOCTL_COMPAT) || c != _IO(FLOOR_TYPE, rounds) || rounds < 1 ||
        rounds > FLOOR_MAX_ROUNDS) {
        fuse_reply_err(req, ENOTTY);
        return;
    }
    if (rounds == 1) {
        fuse_reply_ioctl(req, 0, NULL, 0);
        return;
    }
    struct iovec iov[4];
    iov[0].iov_base = arg;
    iov[0].iov_len = sizeof(struct floor_top);
    if (in_bufsz == 0) { /* round 1 */
        retry(req, iov, 1);
        return;
    }
    if (in_bufsz < sizeof(struct floor_top)) {
        fuse_reply_err(req, EPROTO);
        return;
    }
    if (rounds == 2) { /* round 2 of 2 */
        fuse_reply_ioctl(req, 0, in_buf, in_bufsz);
        return;
    }
    struct floor_top top;
    memcpy(&top, in_buf, sizeof top);
    if (top.size > FLOOR_MAX_BUF) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    iov[1].iov_base = (void *)(uintptr_t)top.ptr;
    iov[1].iov_len = top.size;
    size_t have = sizeof top + top.size;
    if (in_bufsz == sizeof top) { /* round 2 of 3 or 4 */
        retry(req, iov, 2);
        return;
    }
    if (in_bufsz < have) {
        fuse_reply_err(req, EPROTO);
        return;
    }
    if (rounds == 3) { /* round 3 of 3 */
        fuse_reply_ioctl(req, 0, in_buf, in_bufsz);
        return;
    }
    if (top.size < FLOOR_NESTED_HDR) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    struct floor_nested nested;
    memcpy(&nested.ptr, (const char *)in_buf + sizeof top, 8);
    memcpy(&nested.size, (const char *)in_buf + sizeof top + 8, 4);
    if (nested.size > FLOOR_MAX_BUF) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    iov[2].iov_base = (void *)(uintptr_t)nested.ptr;
    iov[2].iov_len = nested.size;
    if (in_bufsz == have) { /* round 3 of 4 or more */
        retry(req, iov, 3);
        return;
    }
    have += nested.size;
    if (in_bufsz < have || in_bufsz - have > rounds - 4 || nested.size < rounds - 4) {
        fuse_reply_err(req, EPROTO);
        return;
    }
    size_t extra = in_bufsz - have; /* round 4 + extra */
    if (extra == rounds - 4u) {     /* the last round */
        fuse_reply_ioctl(req, 0, in_buf, in_bufsz);
        return;
    }
    iov[3].iov_base = (void *)(uintptr_t)nested.ptr;
    iov[3].iov_len = extra + 1;
    retry(req, iov, 4);
}

static const struct cuse_lowlevel_ops floor_ops = {
    .init_done = floor_init_done,
    .open = floor_open,
    .ioctl = floor_ioctl,
};

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [--name DEVNAME] [--single]\n", prog);
}

int main(int argc, char **argv)
{
    const char *name = "nvbench-floor";
    int single = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--name") && i + 1 < argc) {
            name = argv[++i];
        } else if (!strcmp(argv[i], "--single")) {
            single = 1;
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    snprintf(devpath, sizeof devpath, "/dev/%s", name);

    char devname_arg[160];
    snprintf(devname_arg, sizeof devname_arg, "DEVNAME=%s", name);
    const char *dev_info_argv[] = {devname_arg};
    struct cuse_info ci = {
        .dev_info_argc = 1,
        .dev_info_argv = dev_info_argv,
        .flags = CUSE_UNRESTRICTED_IOCTL,
    };
    /* -f: stay in the foreground; the loop kind is chosen below, not by -s. */
    char *fuse_argv[] = {argv[0], "-f", NULL};
    int multithreaded = 0;
    struct fuse_session *se =
        cuse_lowlevel_setup(2, fuse_argv, &ci, &floor_ops, &multithreaded, NULL);
    if (se == NULL) {
        fprintf(stderr, "cuse_floor: cuse_lowlevel_setup failed (is /dev/cuse there?)\n");
        return 1;
    }
    int res;
    if (single) {
        res = fuse_session_loop(se);
    } else {
        struct fuse_loop_config *cfg = fuse_loop_cfg_create();
        if (cfg == NULL) {
            fprintf(stderr, "cuse_floor: fuse_loop_cfg_create failed\n");
            cuse_lowlevel_teardown(se);
            return 1;
        }
        fuse_loop_cfg_set_clone_fd(cfg, 0);
        res = fuse_session_loop_mt(se, cfg);
        fuse_loop_cfg_destroy(cfg);
    }
    cuse_lowlevel_teardown(se);
    return res == 0 ? 0 : 1;
}
