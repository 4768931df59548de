/*
 * edgehop-criu-gate.so: preloaded into the real criu by edgehop-criu
 * (LD_PRELOAD) for a gated dump or restore. Its constructor runs once the
 * dynamic loader has mapped and relocated CRIU and its libraries, before
 * CRIU's main reads runc's request, and waits there at the agent's gate
 * (EDGEHOP_CRIU_GATE_WAIT): CRIU's start falls before the gate opens, not
 * after. Called off, CRIU exits before it reads the request, with the
 * container untouched.
 *
 * It also lets CRIU dump a service whose processes run as users other
 * than root's real ids (a root master with unprivileged workers) where
 * root lacks CAP_SYS_RESOURCE: CRIU reads each process's rlimits with
 * prlimit64, which the kernel then allows only to a caller whose real
 * ids are the process's (check_prlimit_permission). Refused so, the call
 * is answered from /proc/PID/limits, which shows the same limits to
 * anyone (see syscall below).
 *
 * With EDGEHOP_CRIU_LOG_LEVEL set it makes CRIU log at that level
 * rather than the one runc's request asks for (4: every step, some
 * 30,000 lines and 20 ms of writes for a dump of Apache with PHP; CRIU
 * applies the request's level over its configuration file's): see recv
 * below.
 *
 * With EDGEHOP_CRIU_GATE_LATE set (the agent checked that CRIU imports
 * the calls below) it waits later than its constructor (late_gate): CRIU
 * reads runc's request and prepares before the gate opens (its kernel
 * probes, which its feature cache leaves out, and its CPU's, each CPUID a
 * VM exit here: about a millisecond; a dump's cgroups and inventory too).
 * A dump waits right before it seizes the service's tasks, while the
 * service still runs; a restore right before it opens its first image, as
 * the images are all there only once the gate opens.
 *
 * It takes itself out of the environment first, so that nothing CRIU
 * runs (a helper, an action script) loads it. With EDGEHOP_CRIU_GATE_PROBE
 * set it prints "edgehop-criu-gate" and, when /proc/self/limits reads as
 * getrlimit does, "rlimits", and exits: the agent's check that this criu
 * loads it (a static criu would not, and would not wait).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "gate.h"

/*
 * limit_names are /proc/PID/limits' rows, one per resource in resource
 * order (the kernel's lnames, fs/proc/base.c), each row "%-25s %-20s
 * %-20s %-10s": the name, the soft and the hard limit ("unlimited" or a
 * number), the unit.
 */
static const char *const limit_names[] = {
	"Max cpu time",	     "Max file size",	"Max data size",       "Max stack size",
	"Max core file size", "Max resident set", "Max processes",       "Max open files",
	"Max locked memory", "Max address space", "Max file locks",      "Max pending signals",
	"Max msgqueue size", "Max nice priority", "Max realtime priority", "Max realtime timeout",
};

/* limit_value parses one limit at *p and moves *p past it; -1 if none. */
static int limit_value(const char **p, uint64_t *v)
{
	char *end;

	while (**p == ' ')
		(*p)++;
	if (strncmp(*p, "unlimited", 9) == 0) {
		*v = RLIM64_INFINITY;
		*p += 9;
		return 0;
	}
	if (**p < '0' || **p > '9')
		return -1;
	errno = 0;
	*v = strtoull(*p, &end, 10);
	if (errno || (*end != ' ' && *end != '\n' && *end != '\0'))
		return -1;
	*p = end;
	return 0;
}

#define NLIMITS ((long)(sizeof(limit_names) / sizeof(limit_names[0])))

/*
 * read_limits reads every row of /proc/PID/limits into lims: 0, or -1
 * when the file or a row is not as expected.
 */
static int read_limits(long pid, struct rlimit64 lims[NLIMITS])
{
	char path[64], buf[4096];
	const char *line, *p;
	ssize_t n, got = 0;
	long row;
	int fd;

	snprintf(path, sizeof(path), "/proc/%ld/limits", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while ((n = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
		got += n;
	close(fd);
	if (n < 0)
		return -1;
	buf[got] = '\0';
	line = strchr(buf, '\n'); /* past the header */
	for (row = 0; row < NLIMITS; row++) {
		if (!line)
			return -1;
		line++;
		if (strncmp(line, limit_names[row], strlen(limit_names[row])) != 0 || strlen(line) < 26)
			return -1;
		p = line + 25;
		if (limit_value(&p, &lims[row].rlim_cur) < 0 || limit_value(&p, &lims[row].rlim_max) < 0)
			return -1;
		line = strchr(p, '\n');
	}
	return 0;
}

/*
 * limits_from_proc reads resource res of process pid from
 * /proc/PID/limits into lim: 0, or -1 when it cannot. CRIU asks for a
 * process's limits one after the other, with the process frozen: the
 * file is read once per process (the last one read is kept).
 */
static int limits_from_proc(long pid, long res, struct rlimit64 *lim)
{
	static struct rlimit64 cached[NLIMITS];
	static long cached_pid;

	if (res < 0 || res >= NLIMITS)
		return -1;
	if (pid != cached_pid || res == 0) {
		cached_pid = 0;
		if (read_limits(pid, cached) < 0)
			return -1;
		cached_pid = pid;
	}
	*lim = cached[res];
	return 0;
}

/*
 * late_gate is the gate CRIU is still to pass (ENV_GATE_WAIT), empty once
 * passed or when the constructor waited. A dump (CRIU 4.2) sets up its
 * SIGALRM handler (setup_alarm_handler, sigaction), then starts
 * collect_pstree, which arms the alarm, freezes the tasks' cgroup (the
 * agent froze it already) and seizes them (PTRACE_SEIZE): the first of
 * these calls passes the gate, so a CRIU that changed their order still
 * waits before it touches a task. Nothing before them touches the service
 * or writes an image. A restore passes it as it opens its first image
 * (check_img_inventory's).
 */
static char late_gate[108];
/* late_pid is CRIU's own process: a child it forks (a probe of the
 * kernel that ptraces itself, a namespace's dumper) has no gate to pass. */
static pid_t late_pid;
/* late_dump: the late gate is a dump's (else a restore's). */
static int late_dump;

static void pass_late_gate(void)
{
	char name[sizeof(late_gate)];

	if (!late_gate[0] || getpid() != late_pid)
		return;
	memcpy(name, late_gate, sizeof(name));
	late_gate[0] = '\0';
	if (await_gate(name) < 0)
		_exit(1);
}

/* next_sym returns libc's call name, looked up once into *cache: errno
 * ENOSYS and NULL when libc has no such call. */
static void *next_sym(void **cache, const char *name)
{
	if (!*cache)
		*cache = dlsym(RTLD_NEXT, name);
	if (!*cache)
		errno = ENOSYS;
	return *cache;
}

/* sigaction stands in for libc's: SIGALRM's handler is the late gate. */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	static void *libc;
	int (*next)(int, const struct sigaction *, struct sigaction *);

	if (sig == SIGALRM && act && late_dump)
		pass_late_gate();
	next = next_sym(&libc, "sigaction");
	return next ? next(sig, act, old) : -1;
}

/* alarm stands in for libc's: collect_pstree arms it first. */
unsigned int alarm(unsigned int seconds)
{
	static void *libc;
	unsigned int (*next)(unsigned int);

	if (late_dump)
		pass_late_gate();
	next = next_sym(&libc, "alarm");
	return next ? next(seconds) : 0;
}

/* ptrace stands in for libc's: nothing seizes a task past the gate
 * (compel seizes; CRIU's probes of the kernel attach to children of its
 * own with PTRACE_ATTACH, before it reads the request's tasks). */
long ptrace(enum __ptrace_request req, ...)
{
	static void *libc;
	long (*next)(enum __ptrace_request, ...);
	void *pid, *addr, *data;
	va_list ap;

	va_start(ap, req);
	pid = va_arg(ap, void *);
	addr = va_arg(ap, void *);
	data = va_arg(ap, void *);
	va_end(ap);
	if (req == PTRACE_SEIZE && late_dump)
		pass_late_gate();
	next = next_sym(&libc, "ptrace");
	return next ? next(req, pid, addr, data) : -1;
}

/* is_image: path names a CRIU image (NAME.img). */
static int is_image(const char *path)
{
	size_t n = path ? strlen(path) : 0;

	return n > 4 && strcmp(path + n - 4, ".img") == 0;
}

/* open_mode reads an open's mode argument, there when it may create. */
#define open_mode(flags, last)                                 \
	({                                                     \
		mode_t m_ = 0;                                 \
		if ((flags) & (O_CREAT | O_TMPFILE)) {         \
			va_list ap_;                           \
			va_start(ap_, last);                   \
			m_ = va_arg(ap_, mode_t);              \
			va_end(ap_);                           \
		}                                              \
		m_;                                            \
	})

/* next_open returns libc's name (next_sym), passing a restore's late gate
 * at its first image. */
static void *next_open(void **cache, const char *name, const char *path)
{
	if (!late_dump && is_image(path))
		pass_late_gate();
	return next_sym(cache, name);
}

/*
 * openat64 and open64 stand in for libc's (CRIU's opens, _FILE_OFFSET_BITS
 * 64): a restore's first image (its inventory) is its late gate.
 */
int openat64(int dirfd, const char *path, int flags, ...)
{
	static void *libc;
	int (*next)(int, const char *, int, ...) = next_open(&libc, "openat64", path);

	return next ? next(dirfd, path, flags, open_mode(flags, flags)) : -1;
}

int open64(const char *path, int flags, ...)
{
	static void *libc;
	int (*next)(const char *, int, ...) = next_open(&libc, "open64", path);

	return next ? next(path, flags, open_mode(flags, flags)) : -1;
}

/*
 * syscall stands in for libc's in CRIU, which reads a dumped process's
 * rlimits with syscall(__NR_prlimit64, pid, res, NULL, &lim)
 * (dump_task_rlimits). Every call goes to libc's; only a read of another
 * process's limits that the kernel refused with EPERM is answered from
 * /proc/PID/limits instead.
 */
long syscall(long nr, ...)
{
	static void *libc;
	long (*next)(long, ...);
	long a[6], ret;
	va_list ap;
	int i, err;

	va_start(ap, nr);
	for (i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (!(next = next_sym(&libc, "syscall")))
		return -1;
	if (nr == SYS_ptrace && a[0] == PTRACE_SEIZE && late_dump)
		pass_late_gate();
	ret = next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	if (ret < 0 && errno == EPERM && nr == SYS_prlimit64 && a[0] > 0 && a[0] != getpid() && a[2] == 0 && a[3] != 0) {
		err = errno;
		if (limits_from_proc(a[0], a[1], (struct rlimit64 *)a[3]) == 0)
			return 0;
		errno = err;
	}
	return ret;
}

/*
 * log_level is the level CRIU's request is to ask for (ENV_LOG_LEVEL),
 * -1 for the level asked; swrk_fd the socket CRIU serves runc's requests
 * on (criu swrk FD), -1 if this CRIU does not.
 */
static int log_level = -1, swrk_fd = -1;

/* pb_varint reads a protobuf varint at *p (before end) into *v. */
static int pb_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
	int shift;

	*v = 0;
	for (shift = 0; shift < 64 && *p < end; shift += 7) {
		unsigned char b = *(*p)++;

		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
	}
	return -1;
}

/* pb_skip moves *p past a field's value of wire type wt. */
static int pb_skip(const unsigned char **p, const unsigned char *end, uint64_t wt)
{
	uint64_t v;

	switch (wt) {
	case 0:
		return pb_varint(p, end, &v);
	case 1:
	case 5:
		v = wt == 1 ? 8 : 4;
		break;
	case 2:
		if (pb_varint(p, end, &v) < 0)
			return -1;
		break;
	default:
		return -1;
	}
	if (v > (uint64_t)(end - *p))
		return -1;
	*p += v;
	return 0;
}

/*
 * set_log_level rewrites in place the log level of a dump or restore
 * request (rpc.proto: criu_req.type = 1, criu_req.opts = 2,
 * criu_opts.log_level = 9) to level when the value there takes one byte,
 * as level does: 1 if it did, 0 if buf is no such request.
 */
static int set_log_level(unsigned char *buf, size_t len, int level)
{
	const unsigned char *p = buf, *end = buf + len, *q, *qend;
	uint64_t tag, v;

	/* A dump (1) or a restore (2) request starts with its type. */
	if (len < 2 || buf[0] != 0x08 || (buf[1] != 1 && buf[1] != 2))
		return 0;
	while (p < end) {
		if (pb_varint(&p, end, &tag) < 0)
			return 0;
		if (tag != ((2 << 3) | 2)) {
			if (pb_skip(&p, end, tag & 7) < 0)
				return 0;
			continue;
		}
		if (pb_varint(&p, end, &v) < 0 || v > (uint64_t)(end - p))
			return 0;
		for (q = p, qend = p + v; q < qend;) {
			if (pb_varint(&q, qend, &tag) < 0)
				return 0;
			if (tag == ((9 << 3) | 0)) {
				if (q >= qend || *q & 0x80)
					return 0;
				buf[q - buf] = (unsigned char)level;
				return 1;
			}
			if (pb_skip(&q, qend, tag & 7) < 0)
				return 0;
		}
		return 0;
	}
	return 0;
}

/*
 * recv stands in for libc's in CRIU, which reads runc's request on its
 * swrk socket with recv (recv_criu_msg): the first dump or restore
 * request read there gets log_level.
 */
ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	static void *libc;
	ssize_t (*next)(int, void *, size_t, int);
	ssize_t n;

	if (!(next = next_sym(&libc, "recv")))
		return -1;
	n = next(fd, buf, len, flags);
	if (n > 0 && buf && fd == swrk_fd && log_level >= 0 && !(flags & MSG_PEEK) &&
	    set_log_level(buf, (size_t)n < len ? (size_t)n : len, log_level))
		log_level = -1;
	return n;
}

/* swrk_socket returns the FD of `criu swrk FD` from the command line. */
static int swrk_socket(void)
{
	char buf[256], *arg, *end;
	ssize_t n, got = 0;
	long fd;
	int f;

	f = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (f < 0)
		return -1;
	while ((n = read(f, buf + got, sizeof(buf) - 1 - got)) > 0)
		got += n;
	close(f);
	buf[got] = '\0';
	arg = buf + strlen(buf) + 1; /* past argv[0] */
	if (arg >= buf + got || strcmp(arg, "swrk") != 0)
		return -1;
	arg += strlen(arg) + 1;
	if (arg >= buf + got)
		return -1;
	errno = 0;
	fd = strtol(arg, &end, 10);
	if (errno || *end || fd < 0 || fd > 1 << 20)
		return -1;
	return (int)fd;
}

/* rlimits_readable: /proc/self/limits reads as getrlimit64 says. */
static int rlimits_readable(void)
{
	struct rlimit64 want, got;
	int res;

	for (res = 0; res < RLIM_NLIMITS; res++) {
		if (getrlimit64(res, &want) < 0 || limits_from_proc(getpid(), res, &got) < 0)
			return 0;
		if (want.rlim_cur != got.rlim_cur || want.rlim_max != got.rlim_max)
			return 0;
	}
	return 1;
}

__attribute__((constructor)) static void edgehop_criu_gate(void)
{
	const char *wait = getenv(ENV_GATE_WAIT);
	const char *probe = getenv(ENV_GATE_PROBE);
	const char *level = getenv(ENV_LOG_LEVEL);
	const char *req = getenv(ENV_REQUEST);
	const char *late = getenv(ENV_GATE_LATE);
	char name[108] = "", *end;
	long l;

	if (wait)
		snprintf(name, sizeof(name), "%s", wait);
	unsetenv("LD_PRELOAD");
	unsetenv(ENV_GATE_WAIT);
	unsetenv(ENV_GATE_PROBE);
	unsetenv(ENV_GATE_LATE);
	if (level) {
		errno = 0;
		l = strtol(level, &end, 10);
		if (!errno && !*end && l >= 0 && l <= 4)
			log_level = (int)l;
		unsetenv(ENV_LOG_LEVEL);
	}
	swrk_fd = swrk_socket();
	if (probe) {
		const char *word = rlimits_readable() ? "edgehop-criu-gate\nrlimits\n" : "edgehop-criu-gate\n";
		size_t len = strlen(word);

		_exit(write(STDOUT_FILENO, word, len) == (ssize_t)len ? 0 : 1);
	}
	if (wait && late && swrk_fd >= 0 && req && (strcmp(req, "1") == 0 || strcmp(req, "2") == 0)) {
		/*
		 * A dump or a restore (criu_req_type) by `criu swrk FD` itself
		 * (not a program run in its place, such as a script that
		 * then runs criu): CRIU prepares first.
		 */
		memcpy(late_gate, name, sizeof(late_gate));
		late_pid = getpid();
		late_dump = req[0] == '1';
		return;
	}
	if (wait && await_gate(name) < 0)
		_exit(1);
}
