/*
 * edgehop-criu: the criu that runc runs for edgehop's checkpoints and
 * restores. It stands in front of the real criu (EDGEHOP_CRIU) so that
 * runc's work stays out of the frozen window:
 *
 *  - runc asks `criu swrk` for CRIU's version before every checkpoint and
 *    restore. Started as CRIU, that costs ~7 ms; this program answers
 *    with CRIU's own reply, recorded once by the agent
 *    (EDGEHOP_CRIU_VERSION names the file), in well under 1 ms.
 *  - A dump request waits at a gate (EDGEHOP_CRIU_GATE, an abstract unix
 *    socket of the agent) before CRIU reads it: runc starts, probes and
 *    prepares while the service still runs; the agent freezes the service
 *    once runc is at the gate ("ready") and then lets CRIU in ("go").
 *    Anything else, or the agent gone, calls the dump off: CRIU exits
 *    and runc fails the checkpoint without CRIU having touched the
 *    container. When the agent names the gate library
 *    (EDGEHOP_CRIU_GATE_LIB, gate.c, which it checked CRIU loads), CRIU
 *    is started at once with that library preloaded, and waits at the
 *    gate in its constructor: CRIU's exec, the loading of its ~20 shared
 *    libraries and their constructors (3-7 ms on a busy 2-core node) fall
 *    before the freeze. Otherwise this program waits at the gate and
 *    starts CRIU after it.
 *  - A restore request waits at such a gate too, when the agent gives
 *    one: runc starts, mounts and prepares while the images are still on
 *    their way, and CRIU starts once they are all here.
 *  - The gate library is preloaded into every dump and restore, gated or
 *    not: it also answers CRIU's reads of a process's rlimits that the
 *    kernel refuses (root without CAP_SYS_RESOURCE, a process running as
 *    another user) from /proc/PID/limits.
 *
 * Every other invocation, and any request it cannot read, goes to the real
 * criu unchanged (execv with the same arguments and descriptors); the type
 * of the request it read is left in EDGEHOP_CRIU_REQUEST (criu_req_type's
 * number) for whatever runs there.
 *
 * It is C, not Go, because it runs inside runc's critical path: a static C
 * program starts in ~0.5 ms, edgehop's Go binary in ~7 ms.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gate.h"

/* criu_req_type (criu/images/rpc.proto). */
enum { REQ_DUMP = 1, REQ_RESTORE = 2, REQ_VERSION = 10 };

static void run_criu(const char *criu, char **argv)
{
	argv[0] = (char *)criu;
	execv(criu, argv);
	fprintf(stderr, "edgehop-criu: exec %s: %s\n", criu, strerror(errno));
	exit(127);
}

/*
 * request_type reads field 1 (type, a varint) of the serialized criu_req in
 * buf; -1 when buf is not such a message. Encoders write fields in number
 * order, so it is the first field; nothing else is parsed.
 */
static long request_type(const unsigned char *buf, ssize_t n)
{
	long v = 0;
	int shift = 0;
	ssize_t i;

	if (n < 2 || buf[0] != 0x08)
		return -1;
	for (i = 1; i < n && shift < 63; i++, shift += 7) {
		v |= (long)(buf[i] & 0x7f) << shift;
		if (!(buf[i] & 0x80))
			return v;
	}
	return -1;
}

/*
 * reply_version answers a version request from the recorded reply and
 * exits; it returns -1 only when it cannot (no usable reply recorded).
 */
static int reply_version(int sk, const char *path)
{
	unsigned char req[64], resp[4096];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, resp, sizeof(resp));
	close(fd);
	if (n <= 0 || n == sizeof(resp))
		return -1;
	if (recv(sk, req, sizeof(req), 0) < 0)
		return -1;
	if (send(sk, resp, n, MSG_NOSIGNAL) != n) {
		fprintf(stderr, "edgehop-criu: send version: %s\n", strerror(errno));
		exit(1);
	}
	exit(0);
}

int main(int argc, char **argv)
{
	const char *criu = getenv("EDGEHOP_CRIU");
	const char *version = getenv("EDGEHOP_CRIU_VERSION");
	const char *gate = getenv("EDGEHOP_CRIU_GATE");
	unsigned char buf[64];
	char *end;
	long sk, type;
	ssize_t n;

	if (!criu || criu[0] != '/') {
		fprintf(stderr, "edgehop-criu: EDGEHOP_CRIU must name the real criu by absolute path\n");
		return 127;
	}
	if (argc != 3 || strcmp(argv[1], "swrk") != 0)
		run_criu(criu, argv);
	errno = 0;
	sk = strtol(argv[2], &end, 10);
	if (errno || *end || sk < 0 || sk > 1 << 20)
		run_criu(criu, argv);
	do
		n = recv((int)sk, buf, sizeof(buf), MSG_PEEK);
	while (n < 0 && errno == EINTR);
	type = request_type(buf, n);
	if (type == REQ_VERSION && version && version[0])
		reply_version((int)sk, version); /* returns only when it cannot */
	if (type == REQ_DUMP || type == REQ_RESTORE) {
		const char *lib = getenv(ENV_GATE_LIB);
		int gated = gate && gate[0];

		/*
		 * Run with real ids other than its effective ones (a dump as
		 * the service's user, runc.CheckpointOpts.RealIDs), CRIU is a
		 * secure exec and the loader ignores LD_PRELOAD: CRIU would
		 * not wait. Then this program waits. Preloaded, the library
		 * also answers CRIU's reads of rlimits the kernel refuses
		 * (gate.c), ungated too.
		 */
		if (lib && lib[0] == '/' && getuid() == geteuid() && getgid() == getegid() && access(lib, R_OK) == 0) {
			/* CRIU starts now and waits at the gate in its library. */
			if (setenv("LD_PRELOAD", lib, 1) || (gated && setenv(ENV_GATE_WAIT, gate, 1))) {
				fprintf(stderr, "edgehop-criu: setenv: %s\n", strerror(errno));
				exit(1);
			}
		} else if (gated && await_gate(gate) < 0) {
			exit(1);
		}
	}
	if (type >= 0) {
		char t[24];

		snprintf(t, sizeof(t), "%ld", type);
		setenv(ENV_REQUEST, t, 1);
	}
	run_criu(criu, argv);
	return 127;
}
