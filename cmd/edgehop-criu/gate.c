/*
 * edgehop-criu-gate.so: preloaded into the real criu by edgehop-criu
 * (LD_PRELOAD) for a gated dump or restore. Its constructor runs once the
 * dynamic loader has mapped and relocated CRIU and its libraries, before
 * CRIU's main reads runc's request, and waits there at the agent's gate
 * (EDGEHOP_CRIU_GATE_WAIT): CRIU's start falls before the gate opens, not
 * after. Called off, CRIU exits before it reads the request, with the
 * container untouched.
 *
 * It takes itself out of the environment first, so that nothing CRIU
 * runs (a helper, an action script) loads it. With EDGEHOP_CRIU_GATE_PROBE
 * set it prints "edgehop-criu-gate" and exits: the agent's check that this
 * criu loads it (a static criu would not, and would not wait).
 */
#include <stdlib.h>

#include "gate.h"

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
		static const char word[] = "edgehop-criu-gate\n";

		_exit(write(STDOUT_FILENO, word, sizeof(word) - 1) == sizeof(word) - 1 ? 0 : 1);
	}
	if (wait && await_gate(name) < 0)
		_exit(1);
}
