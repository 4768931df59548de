/* pollwait: waits in poll(2) with a timeout on a pipe nobody writes to,
 * and says how the wait ended. Unlike most programs it does not retry on
 * EINTR, so it shows what a checkpoint did to a task blocked there:
 * "timeout" when the wait ran its course, "EINTR" when it was cut short.
 * Usage: pollwait MILLISECONDS */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
	int fds[2];
	if (argc != 2 || pipe(fds) != 0)
		return 2;
	struct pollfd p = {.fd = fds[0], .events = POLLIN};
	printf("waiting\n");
	fflush(stdout);
	int r = poll(&p, 1, atoi(argv[1]));
	if (r < 0 && errno == EINTR)
		printf("EINTR\n");
	else if (r == 0)
		printf("timeout\n");
	else
		printf("poll returned %d\n", r);
	fflush(stdout);
	for (;;)
		pause();
}
