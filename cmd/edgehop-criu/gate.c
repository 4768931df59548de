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
 * It takes itself out of the environment first, so that nothing CRIU
 * runs (a helper, an action script) loads it. With EDGEHOP_CRIU_GATE_PROBE
 * set it prints "edgehop-criu-gate" and, when /proc/self/limits reads as
 * getrlimit does, "rlimits", and exits: the agent's check that this criu
 * loads it (a static criu would not, and would not wait).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
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
 * syscall stands in for libc's in CRIU, which reads a dumped process's
 * rlimits with syscall(__NR_prlimit64, pid, res, NULL, &lim)
 * (dump_task_rlimits). Every call goes to libc's; only a read of another
 * process's limits that the kernel refused with EPERM is answered from
 * /proc/PID/limits instead.
 */
long syscall(long nr, ...)
{
	static long (*next)(long, ...);
	long a[6], ret;
	va_list ap;
	int i, err;

	va_start(ap, nr);
	for (i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (!next)
		next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	ret = next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
	if (ret < 0 && errno == EPERM && nr == SYS_prlimit64 && a[0] > 0 && a[0] != getpid() && a[2] == 0 && a[3] != 0) {
		err = errno;
		if (limits_from_proc(a[0], a[1], (struct rlimit64 *)a[3]) == 0)
			return 0;
		errno = err;
	}
	return ret;
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
	char name[108] = "";

	if (wait)
		snprintf(name, sizeof(name), "%s", wait);
	unsetenv("LD_PRELOAD");
	unsetenv(ENV_GATE_WAIT);
	unsetenv(ENV_GATE_PROBE);
	if (probe) {
		const char *word = rlimits_readable() ? "edgehop-criu-gate\nrlimits\n" : "edgehop-criu-gate\n";
		size_t len = strlen(word);

		_exit(write(STDOUT_FILENO, word, len) == (ssize_t)len ? 0 : 1);
	}
	if (wait && await_gate(name) < 0)
		_exit(1);
}
