/*
 * What programs do with NVIDIA's device nodes, through libc, under the socket transport's shim
 * (tests/tests/socket_shim.rs compiles this twice: plain, and fortified with -O2
 * -D_FORTIFY_SOURCE=2, which turns poll/ppoll/open into __poll_chk/__ppoll_chk/__open_2).
 *
 * Usage: devnode_calls TMPDIR. TMPDIR holds a regular file named nvidia0 containing "hi" (a
 * file with a node's name outside /dev, which must stay the file). Prints one line per check:
 * "NAME ok" or "NAME FAIL: why".
 *
 * The answers a real node gives, which the shim must give too:
 * - stat/statx: a character device 0666, 195:255 (nvidiactl), 195:N (nvidiaN), the UVM major
 *   from NVPROXY_DEV_UVM_MAJOR (nvidia-uvm); ENOENT for a GPU the instance lacks.
 * - open/fopen of the node by any path that resolves to it: an open of that node (the driver
 *   answers its ioctls); O_CREAT|O_EXCL ("wx") EEXIST, as for any existing file.
 * - poll/select/epoll (nvidia_poll in kernel-open/nvidia/nv.c): POLLIN|POLLPRI only while an
 *   RM event is pending on the open, never POLLOUT; with no event pending, nothing is ready and
 *   the caller's timeout runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

static const char *tmpdir;
static int failures;
/* Not constants to the compiler, so that a fortified build calls __poll_chk, __ppoll_chk and
 * __open_2 (glibc's wrappers check constant arguments at compile time instead). */
static volatile int ONE = 1, NOFLAGS = 0;

static void report(const char *name, const char *why) {
    if (why == NULL) {
        printf("%s ok\n", name);
    } else {
        printf("%s FAIL: %s\n", name, why);
        failures++;
    }
    fflush(stdout);
}

static char why_buf[512];
#define WHY(...) (snprintf(why_buf, sizeof why_buf, __VA_ARGS__), why_buf)

static unsigned uvm_major(void) {
    const char *m = getenv("NVPROXY_DEV_UVM_MAJOR");
    return m ? (unsigned)atoi(m) : 510;
}

/* NV_ESC_CHECK_VERSION_STR with NV_RM_API_VERSION_CMD_QUERY: the driver answers
 * NV_RM_API_VERSION_REPLY_RECOGNIZED (1) in the reply word. */
static int driver_answers(int fd) {
    unsigned char v[72];
    memset(v, 0, sizeof v);
    v[0] = '2';
    if (ioctl(fd, 0xc04846d2UL, v) != 0)
        return 0;
    unsigned reply;
    memcpy(&reply, v + 4, 4);
    return reply == 1;
}

/* An open of node (major, minor): fstat shows it, and for nvidiactl the driver answers. */
static const char *node_open(int fd, unsigned major, unsigned minor) {
    if (fd < 0)
        return WHY("open failed: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0)
        return WHY("fstat: %s", strerror(errno));
    if (!S_ISCHR(st.st_mode) || major(st.st_rdev) != major || minor(st.st_rdev) != minor)
        return WHY("fstat shows mode %o rdev %u:%u", st.st_mode, major(st.st_rdev),
                   minor(st.st_rdev));
    if (major == 195 && minor == 255 && !driver_answers(fd))
        return WHY("the driver does not answer CHECK_VERSION_STR: %s", strerror(errno));
    return NULL;
}

static void check_open(const char *name, int fd, unsigned major, unsigned minor) {
    report(name, node_open(fd, major, minor));
    if (fd >= 0)
        close(fd);
}

static const char *node_stat(int r, const struct stat *st, unsigned major, unsigned minor) {
    if (r != 0)
        return WHY("failed: %s", strerror(errno));
    if (st->st_mode != (S_IFCHR | 0666) || major(st->st_rdev) != major ||
        minor(st->st_rdev) != minor)
        return WHY("mode %o rdev %u:%u", st->st_mode, major(st->st_rdev), minor(st->st_rdev));
    return NULL;
}

static const char *node_statx(int r, const struct statx *sx, unsigned major, unsigned minor) {
    if (r != 0)
        return WHY("failed: %s", strerror(errno));
    if ((sx->stx_mask & (STATX_TYPE | STATX_MODE)) != (STATX_TYPE | STATX_MODE))
        return WHY("mask %#x lacks type and mode", sx->stx_mask);
    if (sx->stx_mode != (S_IFCHR | 0666) || sx->stx_rdev_major != major ||
        sx->stx_rdev_minor != minor)
        return WHY("mode %o rdev %u:%u", sx->stx_mode, sx->stx_rdev_major, sx->stx_rdev_minor);
    return NULL;
}

static const char *fails_with(int r, int err) {
    if (r == 0)
        return WHY("succeeded, expected %s", strerror(err));
    if (errno != err)
        return WHY("%s, expected %s", strerror(errno), strerror(err));
    return NULL;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void paths(void) {
    char p[4096];
    int dev = open("/dev", O_RDONLY | O_DIRECTORY);
    if (dev < 0) {
        report("open_dev_dir", WHY("%s", strerror(errno)));
        return;
    }
    if (chdir("/dev") != 0)
        report("chdir_dev", WHY("%s", strerror(errno)));
    check_open("open_relative_cwd_dev", open("nvidiactl", O_RDWR | NOFLAGS), 195, 255);
    check_open("open_dot_relative", open("./nvidia0", O_RDWR), 195, 0);
    check_open("openat_dev_dirfd", openat(dev, "nvidia0", O_RDWR | NOFLAGS), 195, 0);
    check_open("openat_dirfd_dotdot", openat(dev, "../dev/nvidia-uvm", O_RDWR), uvm_major(), 0);
    check_open("open_absolute_dotdot", open("/dev/../dev/nvidiactl", O_RDWR), 195, 255);
    check_open("open_slashes_and_dot", open("//dev/./nvidiactl", O_RDWR | O_CLOEXEC), 195, 255);
    report("openat_missing_gpu", fails_with(openat(dev, "nvidia7", O_RDWR) < 0 ? -1 : 0, ENOENT));
    if (chdir(tmpdir) != 0)
        report("chdir_tmp", WHY("%s", strerror(errno)));
    snprintf(p, sizeof p, "%s/devlink", tmpdir);
    unlink(p);
    if (symlink("/dev", p) != 0)
        report("symlink", WHY("%s", strerror(errno)));
    check_open("open_through_dir_symlink", open("devlink/nvidiactl", O_RDWR), 195, 255);
    unlink(p);
    /* "../../../dev/..." from TMPDIR: as many ".." as it takes to reach / (more stay at /). */
    snprintf(p, sizeof p, "../../../../../../../../../../dev/nvidiactl");
    check_open("open_relative_dotdot_from_tmp", open(p, O_RDWR), 195, 255);
    /* A file with a node's name elsewhere is that file. */
    {
        int fd = open("nvidia0", O_RDONLY);
        char b[3] = {0};
        struct stat st;
        if (fd < 0)
            report("open_other_dir_same_name", WHY("%s", strerror(errno)));
        else if (read(fd, b, 2) != 2 || strcmp(b, "hi") != 0 || fstat(fd, &st) != 0 ||
                 !S_ISREG(st.st_mode))
            report("open_other_dir_same_name", WHY("not the regular file: '%s'", b));
        else
            report("open_other_dir_same_name", NULL);
        if (fd >= 0)
            close(fd);
        report("open_other_dir_missing_name",
               fails_with(open("nvidiactl", O_RDWR) < 0 ? -1 : 0, ENOENT));
    }
    close(dev);
}

static void stats(void) {
    struct stat st;
    struct statx sx;
    int dev = open("/dev", O_RDONLY | O_DIRECTORY);
    if (chdir("/dev") != 0)
        report("chdir_dev", WHY("%s", strerror(errno)));
    memset(&sx, 0, sizeof sx);
    report("statx_absolute", node_statx(statx(AT_FDCWD, "/dev/nvidiactl", 0, STATX_BASIC_STATS,
                                              &sx), &sx, 195, 255));
    memset(&sx, 0, sizeof sx);
    report("statx_dirfd", node_statx(statx(dev, "nvidia0", 0, STATX_BASIC_STATS, &sx), &sx,
                                     195, 0));
    memset(&sx, 0, sizeof sx);
    report("statx_relative_uvm", node_statx(statx(AT_FDCWD, "nvidia-uvm", AT_SYMLINK_NOFOLLOW,
                                                  STATX_TYPE | STATX_MODE, &sx), &sx,
                                            uvm_major(), 0));
    {
        int fd = open("/dev/nvidiactl", O_RDWR);
        memset(&sx, 0, sizeof sx);
        report("statx_empty_path_fd", node_statx(statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS,
                                                       &sx), &sx, 195, 255));
        memset(&sx, 0, sizeof sx);
        /* Linux 6.11 on: no path at all with AT_EMPTY_PATH. */
        report("statx_null_path_fd", node_statx(statx(fd, NULL, AT_EMPTY_PATH, STATX_BASIC_STATS,
                                                      &sx), &sx, 195, 255));
        report("fstatat_empty_path_fd", node_stat(fstatat(fd, "", &st, AT_EMPTY_PATH), &st, 195,
                                                  255));
        close(fd);
    }
    report("statx_missing_gpu", fails_with(statx(AT_FDCWD, "/dev/nvidia7", 0, STATX_BASIC_STATS,
                                                 &sx), ENOENT));
    report("stat_relative", node_stat(stat("nvidiactl", &st), &st, 195, 255));
    report("fstatat_dirfd", node_stat(fstatat(dev, "nvidia0", &st, 0), &st, 195, 0));
    report("lstat_dotdot", node_stat(lstat("/dev/../dev/nvidiactl", &st), &st, 195, 255));
    report("access_relative", access("nvidiactl", R_OK | W_OK) == 0 ? NULL
                                                                     : WHY("%s", strerror(errno)));
    report("faccessat_dirfd", faccessat(dev, "nvidia0", R_OK, 0) == 0 ? NULL
                                                                       : WHY("%s", strerror(errno)));
    report("euidaccess_relative", euidaccess("nvidia-uvm", R_OK | W_OK) == 0
                                      ? NULL : WHY("%s", strerror(errno)));
    report("access_missing_gpu", fails_with(access("nvidia7", R_OK), ENOENT));
    if (chdir(tmpdir) != 0)
        report("chdir_tmp", WHY("%s", strerror(errno)));
    report("fstatat_dotdot_from_tmp",
           node_stat(fstatat(AT_FDCWD, "../../../../../../../../../../dev/nvidiactl", &st, 0), &st,
                     195, 255));
    memset(&sx, 0, sizeof sx);
    report("statx_other_dir_same_name",
           statx(AT_FDCWD, "nvidia0", 0, STATX_BASIC_STATS, &sx) == 0 && S_ISREG(sx.stx_mode)
               ? NULL : WHY("not the regular file: mode %o (%s)", sx.stx_mode, strerror(errno)));
    close(dev);
}

static void fopens(void) {
    if (chdir("/dev") != 0)
        report("chdir_dev", WHY("%s", strerror(errno)));
    FILE *f = fopen("/dev/nvidiactl", "r+");
    report("fopen", f ? node_open(fileno(f), 195, 255) : WHY("%s", strerror(errno)));
    if (f)
        fclose(f);
    f = fopen64("nvidia0", "rb");
    report("fopen64_relative", f ? node_open(fileno(f), 195, 0) : WHY("%s", strerror(errno)));
    if (f)
        fclose(f);
    f = fopen("nvidiactl", "r+e");
    if (!f)
        report("fopen_cloexec", WHY("%s", strerror(errno)));
    else {
        int fl = fcntl(fileno(f), F_GETFD);
        const char *why = node_open(fileno(f), 195, 255);
        report("fopen_cloexec", why ? why : (fl & FD_CLOEXEC) ? NULL : "FD_CLOEXEC not set");
        fclose(f);
    }
    f = fopen("/dev/nvidiactl", "r+");
    if (!f)
        report("fopen_no_cloexec", WHY("%s", strerror(errno)));
    else {
        int fl = fcntl(fileno(f), F_GETFD);
        report("fopen_no_cloexec", (fl & FD_CLOEXEC) ? "FD_CLOEXEC set without 'e'" : NULL);
        fclose(f);
    }
    errno = 0;
    f = fopen("/dev/nvidia7", "r");
    report("fopen_missing_gpu", f ? "opened" : errno == ENOENT ? NULL : WHY("%s", strerror(errno)));
    errno = 0;
    f = fopen("nvidiactl", "wx");
    report("fopen_excl_existing",
           f ? "opened" : errno == EEXIST ? NULL : WHY("%s", strerror(errno)));
    errno = 0;
    f = fopen("nvidiactl", "q");
    report("fopen_bad_mode", f ? "opened" : errno == EINVAL ? NULL : WHY("%s", strerror(errno)));
    f = freopen("/dev/nvidiactl", "r+", stdin);
    if (!f)
        report("freopen_stdin", WHY("%s", strerror(errno)));
    else if (f != stdin || fileno(f) != 0)
        report("freopen_stdin", WHY("stream %p fd %d", (void *)f, fileno(f)));
    else
        report("freopen_stdin", node_open(0, 195, 255));
    char p[4096];
    snprintf(p, sizeof p, "%s/nvidia0", tmpdir);
    FILE *g = fopen(p, "r");
    if (!g)
        report("freopen64_relative", WHY("fopen %.200s: %s", p, strerror(errno)));
    else {
        int before = fileno(g);
        f = freopen64("nvidia0", "r+", g);
        report("freopen64_relative", !f ? WHY("%s", strerror(errno))
                                        : fileno(f) != before ? WHY("fd %d, was %d", fileno(f),
                                                                    before)
                                                              : node_open(fileno(f), 195, 0));
        if (f)
            fclose(f);
    }
    if (chdir(tmpdir) != 0)
        report("chdir_tmp", WHY("%s", strerror(errno)));
    f = fopen("nvidia0", "r");
    char b[3] = {0};
    report("fopen_other_dir_same_name",
           f && fread(b, 1, 2, f) == 2 && strcmp(b, "hi") == 0 ? NULL : "not the regular file");
    if (f)
        fclose(f);
}

/* poll/ppoll/select/pselect/epoll on an open with no event pending: nothing ready, the
 * timeout runs; a ready fd beside it is reported alone; other fds are untouched. */
static void polls(void) {
    int fd = open("/dev/nvidiactl", O_RDWR);
    int pipefd[2];
    if (fd < 0 || pipe(pipefd) != 0) {
        report("poll_setup", WHY("%s", strerror(errno)));
        return;
    }
    struct pollfd p[2];
    double t;
    int r;

    p[0] = (struct pollfd){.fd = fd, .events = POLLIN | POLLOUT | POLLPRI};
    t = now_ms();
    r = poll(p, (nfds_t)ONE, 200);
    t = now_ms() - t;
    report("poll_no_event_waits", r == 0 && p[0].revents == 0 && t >= 190 ? NULL
                                  : WHY("r %d revents %#x after %.0f ms", r, p[0].revents, t));
    report("poll_keeps_events", p[0].events == (POLLIN | POLLOUT | POLLPRI) && p[0].fd == fd
                                    ? NULL : WHY("fd %d events %#x", p[0].fd, p[0].events));

    struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
    p[0].revents = 0x7fff;
    t = now_ms();
    r = ppoll(p, (nfds_t)ONE, &ts, NULL);
    t = now_ms() - t;
    report("ppoll_no_event_waits", r == 0 && p[0].revents == 0 && t >= 190 ? NULL
                                   : WHY("r %d revents %#x after %.0f ms", r, p[0].revents, t));

    if (write(pipefd[1], "x", 1) != 1)
        report("pipe_write", WHY("%s", strerror(errno)));
    p[1] = (struct pollfd){.fd = pipefd[0], .events = POLLIN};
    t = now_ms();
    r = poll(p, (nfds_t)(2 * ONE), 5000);
    t = now_ms() - t;
    report("poll_other_fd_ready", r == 1 && p[0].revents == 0 && p[1].revents == POLLIN && t < 1000
                                      ? NULL : WHY("r %d revents %#x %#x after %.0f ms", r,
                                                   p[0].revents, p[1].revents, t));
    r = ppoll(p, (nfds_t)(2 * ONE), NULL, NULL);
    report("ppoll_other_fd_ready", r == 1 && p[0].revents == 0 && p[1].revents == POLLIN
                                       ? NULL : WHY("r %d revents %#x %#x", r, p[0].revents,
                                                    p[1].revents));
    struct pollfd w = {.fd = pipefd[1], .events = POLLOUT};
    report("poll_untouched_writable", poll(&w, 1, 0) == 1 && w.revents == POLLOUT ? NULL
                                      : WHY("revents %#x", w.revents));

    fd_set rs, ws, es;
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200 * 1000};
    FD_ZERO(&rs); FD_ZERO(&ws); FD_ZERO(&es);
    FD_SET(fd, &rs); FD_SET(fd, &ws); FD_SET(fd, &es);
    t = now_ms();
    r = select(fd + 1, &rs, &ws, &es, &tv);
    t = now_ms() - t;
    report("select_no_event_waits", r == 0 && !FD_ISSET(fd, &rs) && !FD_ISSET(fd, &ws) &&
                                            !FD_ISSET(fd, &es) && t >= 190
                                        ? NULL : WHY("r %d after %.0f ms", r, t));
    int n = (fd > pipefd[1] ? fd : pipefd[1]) + 1;
    FD_ZERO(&rs); FD_ZERO(&ws); FD_ZERO(&es);
    FD_SET(fd, &rs); FD_SET(fd, &ws); FD_SET(pipefd[0], &rs); FD_SET(pipefd[1], &ws);
    tv = (struct timeval){.tv_sec = 5};
    r = select(n, &rs, &ws, NULL, &tv);
    report("select_other_fds_ready", r == 2 && FD_ISSET(pipefd[0], &rs) &&
                                             FD_ISSET(pipefd[1], &ws) && !FD_ISSET(fd, &rs) &&
                                             !FD_ISSET(fd, &ws)
                                         ? NULL : WHY("r %d", r));
    FD_ZERO(&ws);
    FD_SET(fd, &ws);
    t = now_ms();
    r = pselect(fd + 1, NULL, &ws, NULL, &ts, NULL);
    t = now_ms() - t;
    report("pselect_no_event_waits", r == 0 && !FD_ISSET(fd, &ws) && t >= 190
                                         ? NULL : WHY("r %d after %.0f ms", r, t));

    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLPRI, .data.fd = fd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
        report("epoll_ctl_add", WHY("%s", strerror(errno)));
    else
        report("epoll_ctl_add", ev.events == (EPOLLIN | EPOLLOUT | EPOLLPRI) ? NULL
                                : "the caller's event was changed");
    struct epoll_event out[4];
    t = now_ms();
    r = epoll_wait(ep, out, 4, 200);
    t = now_ms() - t;
    report("epoll_no_event_waits", r == 0 && t >= 190 ? NULL
                                   : WHY("r %d events %#x after %.0f ms", r,
                                         r > 0 ? out[0].events : 0, t));
    ev = (struct epoll_event){.events = EPOLLOUT, .data.fd = fd};
    r = epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    report("epoll_mod_no_event_waits", r == 0 && epoll_wait(ep, out, 4, 200) == 0 ? NULL
                                       : WHY("r %d", r));
    ev = (struct epoll_event){.events = EPOLLIN, .data.fd = pipefd[0]};
    epoll_ctl(ep, EPOLL_CTL_ADD, pipefd[0], &ev);
    ev = (struct epoll_event){.events = EPOLLOUT, .data.fd = pipefd[1]};
    epoll_ctl(ep, EPOLL_CTL_ADD, pipefd[1], &ev);
    r = epoll_wait(ep, out, 4, 5000);
    int saw_r = 0, saw_w = 0, saw_node = 0;
    for (int i = 0; i < r; i++) {
        saw_r |= out[i].data.fd == pipefd[0] && out[i].events == EPOLLIN;
        saw_w |= out[i].data.fd == pipefd[1] && out[i].events == EPOLLOUT;
        saw_node |= out[i].data.fd == fd;
    }
    report("epoll_other_fds_ready", r == 2 && saw_r && saw_w && !saw_node ? NULL
                                    : WHY("r %d", r));
    report("epoll_ctl_del", epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL) == 0 ? NULL
                            : WHY("%s", strerror(errno)));
    close(ep);
    close(pipefd[0]);
    close(pipefd[1]);
    /* The open still works after all that. */
    report("open_after_polls", driver_answers(fd) ? NULL : WHY("%s", strerror(errno)));
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s TMPDIR\n", argv[0]);
        return 2;
    }
    tmpdir = argv[1];
    paths();
    stats();
    fopens();
    polls();
    /* Last: without the shim this would create a regular file in the namespace's /dev. */
    report("open_excl_existing",
           fails_with(open("/dev/nvidiactl", O_RDWR | O_CREAT | O_EXCL, 0600) < 0 ? -1 : 0,
                      EEXIST));
    printf("done %d\n", failures);
    return failures ? 1 : 0;
}
