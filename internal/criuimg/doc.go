// Package criuimg rewrites a CRIU checkpoint's images before they are
// restored, where the dump left a process a result it would never have
// seen had it not been checkpointed.
//
// RestartSyscalls: a task that the dump found blocked in a system call
// the kernel restarts through a restart block (poll, nanosleep and futex
// waits with a timeout) cannot be restarted that way after a restore, so
// CRIU's dump records it as interrupted: the call returns EINTR when the
// task resumes. Services that do not retry on EINTR then fail a request
// for nothing (Apache's mod_reqtimeout waits for a request line in poll
// and closes the connection, unanswered, on EINTR). RestartSyscalls
// makes each such task issue the same call again instead, as the kernel
// restarts the calls it restarts without a restart block: the
// instruction pointer back on the syscall instruction and the call's
// number in its register, its arguments unchanged. The call starts anew,
// so its timeout counts from the restore (a wait at most that much
// longer, never an error). A signal pending at the dump is restored
// pending and still interrupts the restarted call.
//
// Only x86-64 tasks in native mode are rewritten; other images are left
// as they are, and so is an image that does not decode (CRIU refuses it
// with its own reason). An image that needs no change is not written.
//
// CheckCreds reads the credentials CRIU would give each restored task
// (the core images' thread_core.creds: the four uids and gids, the
// groups, the capability sets) and refuses images from a peer whose tasks
// would run as another user than the container's, as root in a non-root
// container, or with capabilities beyond the container's bounding set.
// It decodes only that field of each core image, not the registers:
// about 0.3 ms for a 20-task tree, so it runs in the frozen window. It
// must not rewrite anything.
//
// DecodePagemap is the one decoder of CRIU's pagemap images (precopy's
// transfer and parent split, runc's memory stats): framing and head
// checked at once, entries decoded one at a time without allocating, as
// pre-copy reads them in the frozen window.
package criuimg
