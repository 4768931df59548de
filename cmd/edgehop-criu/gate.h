/*
 * The gate of edgehop-criu: an abstract unix socket of the agent
 * (runc.Gate). The waiting side connects, says "ready", and is let in by
 * "go"; anything else calls it off. Shared by the shim (edgehop-criu.c)
 * and the library preloaded into CRIU (gate.c).
 */
#ifndef EDGEHOP_CRIU_GATE_H
#define EDGEHOP_CRIU_GATE_H

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The gate library's path, set by the agent for the shim. */
#define ENV_GATE_LIB "EDGEHOP_CRIU_GATE_LIB"
/* The gate CRIU's preloaded library waits at, set by the shim. */
#define ENV_GATE_WAIT "EDGEHOP_CRIU_GATE_WAIT"
/* Makes the preloaded library answer and exit (the agent's check). */
#define ENV_GATE_PROBE "EDGEHOP_CRIU_GATE_PROBE"
/* Set by the agent when CRIU imports the calls the late gate needs. */
#define ENV_GATE_LATE "EDGEHOP_CRIU_GATE_LATE"
/* The request's criu_req_type, set by the shim (1: dump, 2: restore). */
#define ENV_REQUEST "EDGEHOP_CRIU_REQUEST"
/* The level CRIU logs at, set by the agent (runc asks for 4, debug). */
#define ENV_LOG_LEVEL "EDGEHOP_CRIU_LOG_LEVEL"

/*
 * await_gate returns 0 when the agent lets the request in, and -1 (said
 * on stderr) when it calls it off or cannot be reached.
 */
static int await_gate(const char *name)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(name);
	char word[16];
	ssize_t n;
	int sk;

	if (len == 0 || len >= sizeof(sa.sun_path) - 1) {
		fprintf(stderr, "edgehop-criu: bad gate name\n");
		return -1;
	}
	memcpy(sa.sun_path + 1, name, len); /* abstract: sun_path[0] is 0 */
	sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sk < 0 || connect(sk, (struct sockaddr *)&sa, offsetof(struct sockaddr_un, sun_path) + 1 + len) < 0) {
		fprintf(stderr, "edgehop-criu: gate %s: %s\n", name, strerror(errno));
		return -1;
	}
	if (send(sk, "ready\n", 6, MSG_NOSIGNAL) != 6) {
		fprintf(stderr, "edgehop-criu: gate: %s\n", strerror(errno));
		close(sk);
		return -1;
	}
	do
		n = recv(sk, word, sizeof(word) - 1, 0);
	while (n < 0 && errno == EINTR);
	close(sk);
	if (n < 3 || memcmp(word, "go\n", 3) != 0) {
		fprintf(stderr, "edgehop-criu: called off by the agent\n");
		return -1;
	}
	return 0;
}

#endif
