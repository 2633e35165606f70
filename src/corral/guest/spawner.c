/*
 * corral-spawner: the main process of every Docker and gVisor workspace. It starts commands for the guest agent.
 *
 * gVisor restores only the container's own process tree after a checkpoint: whatever `docker exec` started (the
 * agent, and every command the agent would start itself) is gone. So the agent asks this process, over
 * /run/corral/spawner.sock, to start each command; commands, and the daemons they leave behind, belong to the
 * container's tree and come back after a restore. It gives the workspace nothing it does not have (anyone in it is
 * root in it already), and it is a small static binary, not a Python interpreter, because everything the sandbox
 * holds is written out by every checkpoint: an idle workspace pauses as fast as one running `sleep`.
 *
 * It is compiled on the host (gcc -static) into the read-only agent runtime by corral.providers.agent_runtime.
 *
 * Protocol, one connection per command (agent.py's Spawned is the client):
 *   request: sendmsg of a 4-byte big-endian length N carrying three descriptors (SCM_RIGHTS: the command's stdin,
 *            stdout, stderr), then N bytes of NUL-terminated strings: argc, envc (decimal), cwd, uid, gid (decimal,
 *            -1 keeps root), tty ("1": stdin is a terminal that becomes the command's controlling terminal), then
 *            argv..., env...
 *   replies: "pid <pid>\n", or "error <stage> <errno>\n" (stage: cwd, user, exec or fork) and the connection ends;
 *            then "exit <status>\n" when the command ends (its exit status, or minus the signal that killed it).
 * Each connection is served by its own handler process, so a slow or hostile client holds only its own handler.
 * Handlers are forked ahead of the request: POOL_SIZE idle handlers wait in accept() themselves, and the one that takes
 * a connection tells the main loop (a byte on a pipe), which forks its replacement; at request time only the command
 * is started, with vfork, so no fork (under gVisor's ptrace platform a new address space, about 1.5 ms) is on the
 * request's path. When no handler can be forked (the pids limit), the main loop answers "error fork" itself.
 * Handlers are not left as zombies (SA_NOCLDWAIT); each handler waits for its own command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define SOCKET_DIR "/run/corral"
#define SOCKET_PATH SOCKET_DIR "/spawner.sock"
#define REQUEST_MAX (4 * 1024 * 1024)
#define COUNT_MAX (1 << 20)
#define REQUEST_TIMEOUT_S 10
#define POOL_SIZE 1 /* idle handlers: each is a process (and, under ptrace, a host stub) of an idle workspace */

extern char **environ;

static int read_full(int fd, char *buf, size_t n) {
    while (n > 0) {
        ssize_t got = read(fd, buf, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        buf += got;
        n -= (size_t)got;
    }
    return 0;
}

static void reply(int conn, const char *kind, long value) {
    char line[64];
    int n = snprintf(line, sizeof line, "%s %ld\n", kind, value);
    (void)!send(conn, line, (size_t)n, MSG_NOSIGNAL); /* a vanished agent is not our problem */
}

/* The next NUL-terminated string of the request, or NULL when the request ends first. */
static char *next_string(char **cursor, char *end) {
    char *start = *cursor;
    char *nul = memchr(start, '\0', (size_t)(end - start));
    if (nul == NULL) return NULL;
    *cursor = nul + 1;
    return start;
}

/* The next string as a number in [low, high]; low - 1 when it is missing or not one. */
static long next_number(char **cursor, char *end, long low, long high) {
    char *text = next_string(cursor, end);
    char *rest;
    if (text == NULL || *text == '\0') return low - 1;
    long value = strtol(text, &rest, 10);
    return (*rest != '\0' || value < low || value > high) ? low - 1 : value;
}

struct command {
    char *cwd;
    long uid, gid, tty;
    char **argv, **envp;
};

/* In the vforked command (it shares the handler's memory until it execs or exits, so it only makes system calls and
   writes its own locals): become its own session, take the three descriptors (and the terminal), change directory,
   drop to the user, exec. On failure, the stage and errno go to the handler through a close-on-exec pipe (an exec
   that works closes it empty). */
static void run_command(int fds[3], const struct command *cmd, int status_fd) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigset_t none;
    char stage = 'f';
    sigaction(SIGCHLD, &dfl, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    for (int i = 0; i < 3; i++) {
        if (fds[i] == i ? fcntl(i, F_SETFD, 0) < 0 : dup2(fds[i], i) < 0) goto fail;
    }
    if (cmd->tty == 1 && ioctl(0, TIOCSCTTY, 0) != 0) goto fail;
    stage = 'c';
    if (chdir(cmd->cwd) != 0) goto fail;
    stage = 'u';
    if (cmd->gid >= 0) {
        gid_t gid = (gid_t)cmd->gid;
        if (setgroups(1, &gid) != 0 || setgid(gid) != 0) goto fail;
    }
    if (cmd->uid >= 0 && setuid((uid_t)cmd->uid) != 0) goto fail;
    stage = 'e';
    environ = cmd->envp; /* execvp searches the command's own PATH, as Python's Popen(env=...) does */
    execvp(cmd->argv[0], cmd->argv);
fail:;
    int err = errno;
    (void)!write(status_fd, &stage, 1);
    (void)!write(status_fd, &err, sizeof err);
    _exit(127);
}

static void serve(int conn) {
    struct timeval timeout = {.tv_sec = REQUEST_TIMEOUT_S};
    unsigned char head[4];
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    int fds[3];

    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ssize_t got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    struct cmsghdr *cmsg = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (cmsg == NULL || cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS ||
        cmsg->cmsg_len != CMSG_LEN(sizeof fds) || (msg.msg_flags & MSG_CTRUNC))
        return;
    memcpy(fds, CMSG_DATA(cmsg), sizeof fds);
    if (got < (ssize_t)sizeof head && read_full(conn, (char *)head + got, sizeof head - (size_t)got) != 0) return;
    size_t size = (size_t)head[0] << 24 | (size_t)head[1] << 16 | (size_t)head[2] << 8 | head[3];
    if (size == 0 || size > REQUEST_MAX) return;
    char *body = malloc(size);
    if (body == NULL || read_full(conn, body, size) != 0) return;

    char *cursor = body, *end = body + size;
    struct command cmd;
    long argc = next_number(&cursor, end, 1, COUNT_MAX), envc = next_number(&cursor, end, 0, COUNT_MAX);
    cmd.cwd = next_string(&cursor, end);
    cmd.uid = next_number(&cursor, end, -1, 0x7fffffff);
    cmd.gid = next_number(&cursor, end, -1, 0x7fffffff);
    cmd.tty = next_number(&cursor, end, 0, 1);
    if (argc < 1 || envc < 0 || cmd.cwd == NULL || cmd.uid < -1 || cmd.gid < -1 || cmd.tty < 0) return;
    cmd.argv = calloc((size_t)argc + 1, sizeof *cmd.argv);
    cmd.envp = calloc((size_t)envc + 1, sizeof *cmd.envp);
    if (cmd.argv == NULL || cmd.envp == NULL) return;
    for (long i = 0; i < argc; i++)
        if ((cmd.argv[i] = next_string(&cursor, end)) == NULL) return;
    for (long i = 0; i < envc; i++)
        if ((cmd.envp[i] = next_string(&cursor, end)) == NULL) return;

    int status[2];
    if (pipe2(status, O_CLOEXEC) != 0) {
        reply(conn, "error fork", errno);
        return;
    }
    pid_t pid = vfork(); /* the handler waits (a few microseconds) until the command has exec'd or failed */
    if (pid == 0) run_command(fds, &cmd, status[1]);
    int fork_errno = errno;
    for (int i = 0; i < 3; i++) close(fds[i]);
    close(status[1]);
    if (pid < 0) {
        reply(conn, "error fork", fork_errno);
        return;
    }
    char stage;
    int err = 0;
    ssize_t n;
    while ((n = read(status[0], &stage, 1)) < 0 && errno == EINTR) {
    }
    int wstatus;
    if (n == 1) {
        if (read_full(status[0], (char *)&err, sizeof err) != 0) err = EIO;
        while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
        }
        const char *kind = stage == 'c'   ? "error cwd"
                           : stage == 'e' ? "error exec"
                           : stage == 'u' ? "error user"
                                          : "error fork";
        reply(conn, kind, err);
        return;
    }
    reply(conn, "pid", pid);
    while (waitpid(pid, &wstatus, 0) < 0) {
        if (errno != EINTR) return; /* cannot happen for our own child; the agent hears a lost command */
    }
    reply(conn, "exit", WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -WTERMSIG(wstatus));
}

/* An idle handler: take the next connection, tell the main loop (a byte on its pipe: it forks a replacement) and
   serve it. While idle it dies with the main loop (the workspace is gone then; on the host, a test's spawner leaves
   none behind). */
static void handler(int server, int taken, pid_t main_loop) {
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigaction(SIGCHLD, &dfl, NULL); /* the handler waits for its own command */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != main_loop) _exit(0); /* the main loop died before the line above */
    int conn;
    while ((conn = accept4(server, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        if (errno != EINTR && errno != ECONNABORTED) usleep(10000); /* EMFILE and the like: do not spin */
    }
    prctl(PR_SET_PDEATHSIG, 0);
    (void)!write(taken, "", 1);
    close(server);
    close(taken);
    serve(conn);
    _exit(0);
}

/* Usage: spawner [SOCKET] (the default is /run/corral/spawner.sock; tests run it on the host with their own path). */
int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : SOCKET_PATH;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct sigaction no_zombies = {.sa_handler = SIG_DFL, .sa_flags = SA_NOCLDWAIT};

    int fd;
    while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd < 3) {
    } /* descriptors 0-2 taken, so a received descriptor is never one of them */
    if (fd >= 3) close(fd);
    if (strlen(path) >= sizeof addr.sun_path) {
        fprintf(stderr, "corral-spawner: socket path too long: %s\n", path);
        return 1;
    }
    strcpy(addr.sun_path, path);
    if (argc <= 1 && mkdir(SOCKET_DIR, 0700) != 0 && errno != EEXIST) {
        perror("corral-spawner: " SOCKET_DIR);
        return 1;
    }
    unlink(path);
    int server = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (server < 0 || bind(server, (struct sockaddr *)&addr, sizeof addr) != 0 || chmod(path, 0600) != 0 ||
        listen(server, 128) != 0) {
        perror("corral-spawner: socket");
        return 1;
    }
    sigaction(SIGCHLD, &no_zombies, NULL);
    pid_t main_loop = getpid();
    /* One pipe per idle handler: a byte when it took a connection, end of file when it died idle (anyone in the
       workspace may kill it); either way its slot is free and a replacement is forked. */
    struct pollfd slots[POOL_SIZE + 1];
    for (int i = 0; i < POOL_SIZE; i++) slots[i] = (struct pollfd){.fd = -1, .events = POLLIN};
    slots[POOL_SIZE] = (struct pollfd){.fd = server, .events = POLLIN};
    for (;;) {
        int idle = 0, fork_errno = 0;
        for (int i = 0; i < POOL_SIZE; i++) {
            int taken[2];
            if (slots[i].fd < 0 && fork_errno == 0) {
                if (pipe2(taken, O_CLOEXEC) != 0) {
                    fork_errno = errno;
                    break;
                }
                pid_t pid = fork();
                if (pid == 0) {
                    for (int j = 0; j < POOL_SIZE; j++)
                        if (slots[j].fd >= 0) close(slots[j].fd);
                    close(taken[0]);
                    handler(server, taken[1], main_loop);
                }
                fork_errno = pid < 0 ? errno : 0;
                close(taken[1]);
                if (pid > 0) slots[i].fd = taken[0];
                else close(taken[0]);
            }
            idle += slots[i].fd >= 0;
        }
        /* Without an idle handler (no fork possible: the pids limit), a waiting connection is answered here, since
           its command could not start either; polling again after 10 ms keeps a full pids table from spinning. */
        if (poll(slots, idle > 0 ? POOL_SIZE : POOL_SIZE + 1, idle < POOL_SIZE ? 10 : -1) < 0) continue;
        for (int i = 0; i < POOL_SIZE; i++) {
            if (slots[i].fd >= 0 && slots[i].revents != 0) {
                close(slots[i].fd);
                slots[i].fd = -1;
            }
        }
        if (idle == 0 && (slots[POOL_SIZE].revents & POLLIN)) {
            int conn = accept4(server, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (conn >= 0) {
                reply(conn, "error fork", fork_errno ? fork_errno : EAGAIN);
                close(conn);
            }
        }
    }
}
