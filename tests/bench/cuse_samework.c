/* cuse_samework: the same-work floor for the frontend-proxy benchmark (tests/bench/run-bench.sh,
 * tests/bench/concurrency.sh).
 *
 * tests/bench/cuse_floor.c does the same number of CUSE round trips as the proxy; this device
 * does the same *kernel work* as `nvproxy --memory process-vm` for each measured kind, and
 * nothing else:
 *
 *   - restricted CUSE ioctls (no CUSE_UNRESTRICTED_IOCTL), as the daemon's frontend nodes use
 *     with process-vm: for an _IOWR command the kernel copies the _IOC_SIZE top-level struct in
 *     with the request and back from the reply (one round trip);
 *   - the same process_vm_readv / process_vm_writev calls on the calling thread, with the same
 *     number of local and remote iovecs of the same sizes and in the same order, as the daemon
 *     makes for that kind (measured with strace in the VM: tests/bench/syscalls.sh --vm-detail;
 *     the table is in tests/bench/README.md, "Same-work floor: the syscalls it copies"):
 *
 *     kind            command (top struct)          process_vm_readv            process_vm_writev
 *     simple control  NV_ESC_RM_CONTROL (NVOS54 32) params (paramsSize)         params (paramsSize)
 *     nested control  NV_ESC_RM_CONTROL (NVOS54 32) params (16), then the list   params, list (one call,
 *                     NV0080_CTRL_CMD_GPU_GET_CLASSLIST  (numClasses * 4)          two iovecs)
 *     RM_ALLOC        NV_ESC_RM_ALLOC (NVOS64 48)   pAllocParms (paramsSize)    pAllocParms (paramsSize)
 *     RM_FREE         NV_ESC_RM_FREE (NVOS00 16)    -                           -
 *
 * It answers with fixed plausible bytes (it is a floor, not a driver): status NV_OK in the top
 * struct; a simple control's params are written back as read; the class list gets `numClasses`
 * fixed class numbers; RM_ALLOC's params are written back as read and the handle the caller
 * chose is kept. No handle table, no policy, no audit: everything the proxy does beyond this is
 * the proxy's overhead.
 *
 * Any other command gets ENOTTY. A fault on the caller's memory is EFAULT (as the driver's
 * copy_from_user), a short transfer EFAULT too.
 *
 * Usage: cuse_samework [--name DEVNAME] [--max-threads N] [--spin-ns N]
 *   Registers /dev/DEVNAME (default nvbench-samework); prints "READY /dev/DEVNAME" once the node
 *   exists. --max-threads sets libfuse's multi-threaded loop's thread limit (default 10, libfuse's
 *   own default; the concurrency sweep raises it so that the floor is not capped below the
 *   number of clients, as nvproxy's 128 workers are not). --spin-ns adds N ns of busy work
 *   (reading the clock in a loop) before each answer: a calibration of what a nanosecond of
 *   server work costs the client (tests/bench/README.md, "What server work costs the client").
 *   Runs until killed.
 * Build: gcc -O2 -Wall -o cuse_samework cuse_samework.c $(pkg-config --cflags --libs fuse3)
 */
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE
#include <cuse_lowlevel.h>
#include <fuse_lowlevel.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* nv-ioctl-numbers.h */
#define NV_IOCTL_MAGIC 'F'
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2a
#define NV_ESC_RM_ALLOC 0x2b
#define NV_OK 0u
/* NV0080_CTRL_CMD_GPU_GET_CLASSLIST (ctrl0080gpu.h): params carry a pointer to the class list. */
#define NV0080_CTRL_CMD_GPU_GET_CLASSLIST 0x00800201u
/* RMAPI_PARAM_COPY_MAX_PARAMS_SIZE: the driver refuses larger params. */
#define MAX_PARAMS (1u << 20)
/* A bound for the floor's stack buffers; the benchmark's buffers are far smaller. */
#define MAX_BUF 4096u

/* nvos.h layouts (the same as nvproxy-abi's parity-checked structs). */
struct nvos54 { /* NVOS54_PARAMETERS: RM_CONTROL */
    uint32_t hClient, hObject, cmd, flags;
    uint64_t params;
    uint32_t paramsSize, status;
};
struct nvos64 { /* NVOS64_PARAMETERS: RM_ALLOC */
    uint32_t hRoot, hObjectParent, hObjectNew, hClass;
    uint64_t pAllocParms, pRightsRequested;
    uint32_t paramsSize, flags, status, pad;
};
struct nvos00 { /* NVOS00_PARAMETERS: RM_FREE */
    uint32_t hRoot, hObjectParent, hObjectOld, status;
};
struct classlist { /* NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS */
    uint32_t numClasses, pad;
    uint64_t classList;
};
_Static_assert(sizeof(struct nvos54) == 32, "NVOS54 is 32 bytes");
_Static_assert(offsetof(struct nvos54, params) == 16, "NVOS54.params at 16");
_Static_assert(sizeof(struct nvos64) == 48, "NVOS64 is 48 bytes");
_Static_assert(offsetof(struct nvos64, paramsSize) == 32, "NVOS64.paramsSize at 32");
_Static_assert(sizeof(struct nvos00) == 16, "NVOS00 is 16 bytes");
_Static_assert(sizeof(struct classlist) == 16, "CLASSLIST params are 16 bytes");

#define CMD_CONTROL _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_CONTROL, struct nvos54)
#define CMD_ALLOC _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC, struct nvos64)
#define CMD_FREE _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_FREE, struct nvos00)

static char devpath[160];

static void sw_open(fuse_req_t req, struct fuse_file_info *fi)
{
    fi->direct_io = 1;
    fi->nonseekable = 1;
    fuse_reply_open(req, fi);
}

static void sw_init_done(void *userdata)
{
    (void)userdata;
    struct stat sb;
    for (int i = 0; i < 200 && stat(devpath, &sb) != 0; i++)
        usleep(10000);
    printf("READY %s\n", devpath);
    fflush(stdout);
}

/* One process_vm_readv of `n` (local, remote) pairs; 0 or an errno. */
static int vm_read(pid_t tid, const struct iovec *local, const struct iovec *remote, unsigned long n)
{
    size_t want = 0;
    for (unsigned long i = 0; i < n; i++)
        want += remote[i].iov_len;
    ssize_t got = process_vm_readv(tid, local, n, remote, n, 0);
    return got < 0 ? EFAULT : (size_t)got == want ? 0 : EFAULT;
}

static int vm_write(pid_t tid, const struct iovec *local, const struct iovec *remote, unsigned long n)
{
    size_t want = 0;
    for (unsigned long i = 0; i < n; i++)
        want += remote[i].iov_len;
    ssize_t got = process_vm_writev(tid, local, n, remote, n, 0);
    return got < 0 ? EFAULT : (size_t)got == want ? 0 : EFAULT;
}

static struct iovec iov(void *base, size_t len)
{
    struct iovec v = {.iov_base = base, .iov_len = len};
    return v;
}

/* RM_CONTROL: the params (and, for the class list, the list they point to) are read, answered
 * and written back as the daemon does. */
static int do_control(pid_t tid, struct nvos54 *top)
{
    unsigned char params[MAX_BUF];
    uint32_t size = top->paramsSize;
    if (size == 0 || top->params == 0) {
        top->status = NV_OK;
        return 0;
    }
    if (size > MAX_BUF) /* not something the benchmark sends */
        return EINVAL;
    struct iovec lp = iov(params, size), rp = iov((void *)(uintptr_t)top->params, size);
    int e = vm_read(tid, &lp, &rp, 1);
    if (e)
        return e;
    if (top->cmd == NV0080_CTRL_CMD_GPU_GET_CLASSLIST && size == sizeof(struct classlist)) {
        struct classlist cl;
        memcpy(&cl, params, sizeof cl);
        uint32_t list[MAX_BUF / 4];
        size_t list_len = (size_t)cl.numClasses * 4;
        if (cl.classList == 0 || cl.numClasses == 0) {
            cl.numClasses = 64; /* the count query */
            memcpy(params, &cl, sizeof cl);
            e = vm_write(tid, &lp, &rp, 1);
        } else if (list_len > sizeof list) {
            return EINVAL;
        } else {
            struct iovec ll = iov(list, list_len), rl = iov((void *)(uintptr_t)cl.classList, list_len);
            e = vm_read(tid, &ll, &rl, 1);
            if (e)
                return e;
            for (uint32_t i = 0; i < cl.numClasses; i++)
                list[i] = 0xc000u + i; /* plausible class numbers */
            struct iovec local[2] = {lp, ll}, remote[2] = {rp, rl}; /* the daemon's order */
            e = vm_write(tid, local, remote, 2);
        }
    } else {
        e = vm_write(tid, &lp, &rp, 1); /* a simple control: the params back as read */
    }
    if (e)
        return e;
    top->status = NV_OK;
    return 0;
}

static int do_alloc(pid_t tid, struct nvos64 *top)
{
    unsigned char params[MAX_BUF];
    uint32_t size = top->paramsSize;
    if (size > MAX_PARAMS)
        return EINVAL;
    if (size > 0 && top->pAllocParms != 0) {
        if (size > MAX_BUF)
            return EINVAL;
        struct iovec lp = iov(params, size), rp = iov((void *)(uintptr_t)top->pAllocParms, size);
        int e = vm_read(tid, &lp, &rp, 1);
        if (e)
            return e;
        e = vm_write(tid, &lp, &rp, 1);
        if (e)
            return e;
    }
    if (top->hObjectNew == 0)
        top->hObjectNew = 0xc1d00001u; /* a driver-chosen handle */
    top->status = NV_OK;
    return 0;
}

static long spin_ns, spin_after_ns;

/* Busy work of ns nanoseconds on the serving thread. */
static void spin(long ns)
{
    if (ns <= 0)
        return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ns);
}

static void sw_ioctl(fuse_req_t req, int cmd, void *arg, struct fuse_file_info *fi,
                     unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
    (void)fi;
    (void)arg;
    pid_t tid = fuse_req_ctx(req)->pid; /* the calling thread, as the daemon's req.pid() */
    unsigned c = (unsigned)cmd;
    if (flags & FUSE_IOCTL_COMPAT) {
        fuse_reply_err(req, ENOTTY);
        return;
    }
    int e = ENOTTY;
    union {
        struct nvos54 ctl;
        struct nvos64 alloc;
        struct nvos00 free;
    } top;
    size_t len = 0;
    if (c == CMD_CONTROL)
        len = sizeof top.ctl;
    else if (c == CMD_ALLOC)
        len = sizeof top.alloc;
    else if (c == CMD_FREE)
        len = sizeof top.free;
    if (len == 0) {
        fuse_reply_err(req, ENOTTY);
        return;
    }
    if (in_bufsz != len || out_bufsz != len) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    memcpy(&top, in_buf, len);
    if (c == CMD_CONTROL) {
        e = do_control(tid, &top.ctl);
    } else if (c == CMD_ALLOC) {
        e = do_alloc(tid, &top.alloc);
    } else {
        top.free.status = NV_OK;
        e = 0;
    }
    spin(spin_ns);
    if (e)
        fuse_reply_err(req, e);
    else
        fuse_reply_ioctl(req, 0, &top, len);
    spin(spin_after_ns);
}

static const struct cuse_lowlevel_ops sw_ops = {
    .init_done = sw_init_done,
    .open = sw_open,
    .ioctl = sw_ioctl,
};

int main(int argc, char **argv)
{
    const char *name = "nvbench-samework";
    unsigned max_threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--name") && i + 1 < argc) {
            name = argv[++i];
        } else if (!strcmp(argv[i], "--max-threads") && i + 1 < argc) {
            max_threads = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--spin-ns") && i + 1 < argc) {
            spin_ns = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--spin-after-ns") && i + 1 < argc) {
            spin_after_ns = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--name DEVNAME] [--max-threads N] [--spin-ns N] [--spin-after-ns N]\n",
                    argv[0]);
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
        .flags = 0, /* restricted ioctls, as the daemon's frontend nodes with process-vm */
    };
    char *fuse_argv[] = {argv[0], "-f", NULL};
    int multithreaded = 0;
    struct fuse_session *se = cuse_lowlevel_setup(2, fuse_argv, &ci, &sw_ops, &multithreaded, NULL);
    if (se == NULL) {
        fprintf(stderr, "cuse_samework: cuse_lowlevel_setup failed (is /dev/cuse there?)\n");
        return 1;
    }
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (cfg == NULL) {
        cuse_lowlevel_teardown(se);
        return 1;
    }
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    if (max_threads > 0)
        fuse_loop_cfg_set_max_threads(cfg, max_threads);
    int res = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    cuse_lowlevel_teardown(se);
    return res == 0 ? 0 : 1;
}
