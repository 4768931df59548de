// Package linux owns edgehop's direct use of Linux syscalls: network
// namespaces (create, bind, enter, delete), netlink handles bound to a
// namespace, process discovery by namespace, mount helpers, the cgroup
// freezer, taking a cgroup's TCP sockets out of repair mode (from outside,
// with pidfd_getfd), atomic file writes and no-replace renames, inotify
// watches of files written into a directory, TCP dials that reset,
// never end, should their process die (DialAbortive), socket options,
// packet sockets, statfs and priorities.
//
// No other package of the module imports golang.org/x/sys/unix
// (imports_test.go checks; its allowlist names the files not moved yet).
//
// Every other package reaches the kernel through this one (or through
// netlink handles it returns), so thread/namespace pinning rules live in one
// place. It must not know about testbeds, agents or containers.
package linux
