/* socket_samework: the same-work floor of the socket transport (tests/bench/socket-bench.sh).
 *
 * A minimal server speaking the shim's wire format (preload/proto/src/socket.rs) over the
 * same socket type as the worker (daemon/src/socket_transport.rs), doing per call the same
 * transport work and the same process_vm_readv / process_vm_writev calls as the worker for
 * each measured kind (measured with strace: tests/bench/README.md, "Socket transport"), and
 * nothing else:
 *
 *   - open: a SOCK_SEQPACKET connection to the device socket, an OpenRequest, answered with
 *     the client end of a socketpair (SCM_RIGHTS) whose server end is bound to an abstract
 *     name with the worker's prefix (so the shim recognises it) and has SO_PASSCRED set (every
 *     call then carries the sender's credentials, as the worker's do);
 *   - a call: the message as the shim sends it (protocol version 2: an attach on the open with
 *     the thread's channel attached, once, then the CallRequest on the channel, answered on
 *     it; version 1: the CallRequest with a fresh reply socket attached, answered on that),
 *     served on the thread that read it (one thread per open and per channel);
 *   - the worker's process_vm_* calls for the kind (same iovec counts, sizes, order):
 *
 *     kind            process_vm_readv (one call each)               process_vm_writev (one call)
 *     simple control  NVOS54 (32), params (paramsSize)               [params, NVOS54]
 *     nested control  NVOS54 (32), params (16), list (numClasses*4)  [params, list, NVOS54]
 *     RM_ALLOC        NVOS64 (48), pAllocParms (paramsSize)          [pAllocParms, NVOS64]
 *     RM_FREE         NVOS00 (16)                                    [NVOS00]
 *
 * It answers NV_OK with fixed plausible bytes (as tests/bench/cuse_samework.c): a simple
 * control's params go back as read, the class list gets numClasses fixed class numbers,
 * RM_ALLOC's params go back as read. No fd identity check (pidfd_getfd + SO_COOKIE), no
 * handle table, policy or audit: everything the proxy does beyond this is the proxy's cost.
 * Any other command gets ENOTTY; a fault on the caller's memory EFAULT.
 *
 * Usage: socket_samework --socket PATH
 *   Listens at PATH (removed first, mode 0666); prints "READY PATH". One thread per open
 *   (a client's threads each open their own file in the benchmark). Runs until killed.
 * Build: gcc -O2 -Wall -pthread -o socket_samework socket_samework.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAGIC(a, b, c, d) ((uint32_t)(a) << 24 | (uint32_t)(b) << 16 | (uint32_t)(c) << 8 | (uint32_t)(d))
#define OPEN_REQUEST_MAGIC MAGIC('N', 'V', 'O', 'Q')
#define OPEN_REPLY_MAGIC MAGIC('N', 'V', 'O', 'P')
#define CALL_REQUEST_MAGIC MAGIC('N', 'V', 'C', 'Q')
#define CALL_REPLY_MAGIC MAGIC('N', 'V', 'C', 'P')
#define ATTACH_REQUEST_MAGIC MAGIC('N', 'V', 'A', 'Q')

/* nv-ioctl-numbers.h */
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2a
#define NV_ESC_RM_ALLOC 0x2b
#define NV0080_CTRL_CMD_GPU_GET_CLASSLIST 0x00800201u
#define MAX_BUF 4096u

struct nvos54 { uint32_t hClient, hObject, cmd, flags; uint64_t params; uint32_t paramsSize, status; };
struct nvos64 {
    uint32_t hRoot, hObjectParent, hObjectNew, hClass;
    uint64_t pAllocParms, pRightsRequested;
    uint32_t paramsSize, flags, status, pad;
};
struct nvos00 { uint32_t hRoot, hObjectParent, hObjectOld, status; };
struct classlist { uint32_t numClasses, pad; uint64_t classList; };

/* The wire messages (native-endian). */
struct open_request { uint32_t magic, version, kind, index; int32_t flags; uint32_t zero; };
struct open_reply { uint32_t magic; int32_t err; };
struct call_request {
    uint32_t magic, version, op; int32_t fd; uint32_t cmd, zero;
    uint64_t arg; int32_t prot, flags; int64_t offset;
};
struct attach_request { uint32_t magic, version; int32_t fd; uint32_t zero; };
struct call_reply { uint32_t magic; int32_t err; int32_t result; uint32_t zero; uint64_t adjust; };

static __thread pid_t cur_pid;

static int rd(uint64_t addr, void *buf, size_t n) {
    struct iovec l = {buf, n}, r = {(void *)addr, n};
    return process_vm_readv(cur_pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : EFAULT;
}

static int wr(uint64_t addr, const void *buf, size_t n) {
    struct iovec l = {(void *)buf, n}, r = {(void *)addr, n};
    return process_vm_writev(cur_pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : EFAULT;
}

/* Writes the n buffers l[i] to the caller's addresses r[i] in one call (the worker writes every
 * range it changed at the end of the call, the top-level struct last). */
static int wrv(struct iovec *l, struct iovec *r, int n) {
    ssize_t want = 0;
    for (int i = 0; i < n; i++)
        want += l[i].iov_len;
    return process_vm_writev(cur_pid, l, n, r, n, 0) == want ? 0 : EFAULT;
}

#define IOV(p, n) ((struct iovec){(void *)(uintptr_t)(p), (n)})

/* One ioctl of the caller: 0 or the errno. */
static int serve_ioctl(uint32_t cmd, uint64_t arg) {
    unsigned nr = cmd & 0xff, size = (cmd >> 16) & 0x3fff;
    if (((cmd >> 8) & 0xff) != 'F')
        return ENOTTY;
    if (nr == NV_ESC_RM_CONTROL && size == sizeof(struct nvos54)) {
        struct nvos54 p;
        if (rd(arg, &p, sizeof p))
            return EFAULT;
        unsigned char params[MAX_BUF];
        if (p.paramsSize > MAX_BUF || rd(p.params, params, p.paramsSize))
            return EFAULT;
        p.status = 0;
        if (p.cmd == NV0080_CTRL_CMD_GPU_GET_CLASSLIST && p.paramsSize == sizeof(struct classlist)) {
            struct classlist *c = (struct classlist *)params;
            uint32_t list[MAX_BUF / 4];
            size_t n = (size_t)c->numClasses * 4;
            if (n > sizeof list || rd(c->classList, list, n))
                return EFAULT;
            for (uint32_t i = 0; i < c->numClasses; i++)
                list[i] = 0xc000 + i;
            struct iovec l[3] = {IOV(params, p.paramsSize), IOV(list, n), IOV(&p, sizeof p)};
            struct iovec r[3] = {IOV(p.params, p.paramsSize), IOV(c->classList, n), IOV(arg, sizeof p)};
            return wrv(l, r, 3);
        }
        struct iovec l[2] = {IOV(params, p.paramsSize), IOV(&p, sizeof p)};
        struct iovec r[2] = {IOV(p.params, p.paramsSize), IOV(arg, sizeof p)};
        return wrv(l, r, 2);
    }
    if (nr == NV_ESC_RM_ALLOC && size == sizeof(struct nvos64)) {
        struct nvos64 p;
        if (rd(arg, &p, sizeof p))
            return EFAULT;
        unsigned char params[MAX_BUF];
        if (p.paramsSize > MAX_BUF || rd(p.pAllocParms, params, p.paramsSize))
            return EFAULT;
        p.status = 0;
        struct iovec l[2] = {IOV(params, p.paramsSize), IOV(&p, sizeof p)};
        struct iovec r[2] = {IOV(p.pAllocParms, p.paramsSize), IOV(arg, sizeof p)};
        return wrv(l, r, 2);
    }
    if (nr == NV_ESC_RM_FREE && size == sizeof(struct nvos00)) {
        struct nvos00 p;
        if (rd(arg, &p, sizeof p))
            return EFAULT;
        p.status = 0;
        return wr(arg, &p, sizeof p);
    }
    return ENOTTY;
}

/* Receives one message on `s`: its length, the sender's pid and (if any) one fd. */
static ssize_t receive(int s, void *buf, size_t len, pid_t *pid, int *fd) {
    union { char b[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * 4)]; struct cmsghdr a; } cb;
    struct iovec iov = {buf, len};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cb.b;
    m.msg_controllen = sizeof cb.b;
    ssize_t n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
    *pid = 0;
    *fd = -1;
    if (n < 0)
        return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
            struct ucred u;
            memcpy(&u, CMSG_DATA(c), sizeof u);
            *pid = u.pid;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int fds[4];
            memcpy(fds, CMSG_DATA(c), nfd * sizeof(int));
            for (int i = 0; i < nfd; i++) {
                if (i == 0 && *fd < 0)
                    *fd = fds[i];
                else
                    close(fds[i]);
            }
        }
    }
    return n;
}

static int send_fd(int s, const void *buf, size_t len, int fd, int flags) {
    union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr a; } cb;
    struct iovec iov = {(void *)buf, len};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (fd >= 0) {
        m.msg_control = cb.b;
        m.msg_controllen = sizeof cb.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return sendmsg(s, &m, flags | MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

static int spawn(int s);

/* Serves the frames of one open, or the calls of one channel, until EOF. On an open (protocol
 * 2) a frame is an attach with the channel attached: answered on it, then a thread serves the
 * channel. A call on a channel is answered on it; a call with a reply socket attached
 * (protocol 1) is answered on that socket. */
/* --spin-ns N: busy work before each call's answer (a diagnostic: a server that costs more CPU
 * per call, without more syscalls). */
static long spin_ns;

static void spin(void) {
    if (spin_ns <= 0)
        return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < spin_ns);
}

static void *serve_calls(void *arg) {
    int s = (int)(intptr_t)arg;
    for (;;) {
        union { struct call_request q; struct attach_request a; } u;
        struct call_request q;
        pid_t pid;
        int reply_fd;
        ssize_t n = receive(s, &u, sizeof u, &pid, &reply_fd);
        if (n <= 0 && reply_fd < 0)
            break;
        struct call_reply r = {CALL_REPLY_MAGIC, 0, 0, 0, 0};
        if (n == sizeof u.a && u.a.magic == ATTACH_REQUEST_MAGIC && reply_fd >= 0) {
            int one = 1;
            if (setsockopt(reply_fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0 || spawn(reply_fd) != 0) {
                r.err = EAGAIN;
                send_fd(reply_fd, &r, sizeof r, -1, MSG_DONTWAIT);
                close(reply_fd);
            } else {
                send_fd(reply_fd, &r, sizeof r, -1, MSG_DONTWAIT);
            }
            continue;
        }
        memcpy(&q, &u.q, sizeof q);
        if (n != sizeof q || q.magic != CALL_REQUEST_MAGIC || q.op != 1) {
            r.err = EINVAL;
        } else {
            cur_pid = pid;
            r.err = serve_ioctl(q.cmd, q.arg);
            spin();
        }
        if (reply_fd >= 0) { /* version 1: the answer goes on the reply socket */
            send_fd(reply_fd, &r, sizeof r, -1, MSG_DONTWAIT);
            close(reply_fd);
        } else {
            send_fd(s, &r, sizeof r, -1, MSG_DONTWAIT);
        }
    }
    close(s);
    return NULL;
}

static int spawn(int s) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &a, serve_calls, (void *)(intptr_t)s);
    pthread_attr_destroy(&a);
    return e;
}

/* Binds the server end of an open to the worker's kind of name: "\0nvproxy-open-<code>-<rnd>". */
static int bind_peer(int s, uint64_t code) {
    static unsigned serial;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "nvproxy-open-%llx-%08x%08x%08x%08x",
                     (unsigned long long)code, (unsigned)getpid(), __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED),
                     (unsigned)random(), (unsigned)random());
    return bind(s, (struct sockaddr *)&a, offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void serve_open(int conn) {
    struct open_request q;
    pid_t pid;
    int fd;
    ssize_t n = receive(conn, &q, sizeof q, &pid, &fd);
    if (fd >= 0)
        close(fd);
    struct open_reply r = {OPEN_REPLY_MAGIC, 0};
    int sv[2] = {-1, -1};
    if (n != sizeof q || q.magic != OPEN_REQUEST_MAGIC || q.kind < 1 || q.kind > 3) {
        r.err = EINVAL;
    } else if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        r.err = errno;
    } else {
        int one = 1;
        uint64_t code = q.kind == 1 ? 1 : q.kind == 2 ? 2 : 0x100 + q.index;
        if (setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0 || bind_peer(sv[0], code) != 0 ||
            spawn(sv[0]) != 0) {
            r.err = EIO;
            close(sv[0]);
            close(sv[1]);
            sv[1] = -1;
        }
    }
    send_fd(conn, &r, sizeof r, r.err ? -1 : sv[1], 0);
    if (sv[1] >= 0)
        close(sv[1]);
}

int main(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--spin-ns") && i + 1 < argc)
            spin_ns = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: socket_samework --socket PATH [--spin-ns N]\n");
            return 2;
        }
    }
    if (!path || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        fprintf(stderr, "usage: socket_samework --socket PATH (shorter than 108 bytes)\n");
        return 2;
    }
    srandom(getpid());
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, path);
    unlink(path);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || chmod(path, 0666) != 0 || listen(l, 128) != 0) {
        perror(path);
        return 1;
    }
    printf("READY %s\n", path);
    fflush(stdout);
    for (;;) {
        int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            perror("accept");
            return 1;
        }
        serve_open(c);
        close(c);
    }
}
