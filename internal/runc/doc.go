// Package runc is edgehop's container runtime seam: it writes OCI bundles
// (config.json from the runtime-spec types) and drives the runc binary
// through a container's life — run, state, list, kill, delete — and through
// CRIU checkpoint/restore as runc exposes it (including TCP connections,
// an external network namespace re-bound to a new path on restore, and
// post-copy lazy pages with CRIU's page server). It also reads CRIU's
// dump/restore statistics images and runs the CRIU daemons that pair with a
// lazy or remote-page dump on the receiving node (criu lazy-pages,
// criu page-server).
//
// runc can be given edgehop-criu (cmd/edgehop-criu, Runtime.Shim) as its
// criu: it answers runc's CRIU version probe from CRIU's reply recorded
// once, and holds a dump at a Gate until the caller has frozen the
// service, so that neither runc's start nor its probe falls in the frozen
// window; a dump's Ready comes when CRIU has written its last image,
// before runc is done. A restore can wait at a gate too
// (RestoreOpts.Gate): runc starts, mounts and prepares on descriptors.json
// alone, and CRIU starts once the caller has the images in place; its
// Resumed comes when CRIU has resumed the restored tasks, before runc is
// done, and a runc failing after that keeps a container that runs. With
// the shim's gate library next to it (GateLibName, checked once to load
// into this criu), the real CRIU starts before the gate, reads runc's
// request and prepares, and waits in the library right before it touches
// the service (a dump: as it would seize the tasks) or reads an image (a
// restore), so its exec, dynamic loading, kernel and CPU probes fall
// before the gate opens too; a criu run with real ids not its effective ones (a
// secure exec: LD_PRELOAD ignored) is started by the shim after the gate.
// The library, preloaded into every dump and restore, also answers
// CRIU's reads of a process's rlimits that the kernel refuses to a root
// without CAP_SYS_RESOURCE (a process of another user) from
// /proc/PID/limits (Runtime.ReadsAnyRlimits): services mixing users
// dump as root; without the library, only a service of one user can be
// dumped, with that user's real ids (CheckpointOpts.RealIDs). It sets
// the level of CRIU's log (Runtime.CRIULogLevel) in runc's request,
// whose level CRIU takes over its configuration file's.
// CRIU configuration (WriteCRIUConfig) keeps the
// masked directories and the /sys/fs/cgroup tmpfs out of the images as
// external mounts (ExternalMasks, ExternalCgroupFS with
// MountCgroupSkeleton), and a Spec can bind directories at /dev
// (MakeDevDir) and /dev/shm instead of tmpfs mounts, which CRIU would tar.
// runc 1.1 restores a container's cgroup v1 mount as binds of the
// cgroups the restoring runc itself is in, so a restore starts runc in
// the container's cgroups (RestoreOpts.Cgroups, made by CgroupV1.Make):
// a thread of the caller joins them, forks runc and goes back
// (startIn).
// Restore first rewrites the images' tasks that CRIU recorded as
// interrupted in a poll, sleep or futex wait so that they wait again
// (criuimg.RestartSyscalls): a service that does not retry on EINTR would
// otherwise fail what it was waiting for.
//
// Container stdio is always a set of pipes owned by the Runtime, never a
// host file, because CRIU cannot restore a host file descriptor inside
// another machine's mount namespace; runc maps the pipes recorded at
// checkpoint onto the new pipes given at restore.
//
// It must not create network namespaces, links, addresses or firewall
// rules, unpack images or mount root filesystems, transfer images between
// nodes, or decide when to migrate: callers (the node agent) do those and
// hand this package paths.
package runc
