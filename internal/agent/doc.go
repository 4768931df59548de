// Package agent is the edgehop node agent: it owns one node's containers
// (through runc), its overlay networking (through netplane), its state
// directory and its journal, and serves two APIs: the operator API on a
// unix socket (mode 0600: run, rm, logs, migration jobs, metrics) and the
// peer API on the underlay, mutually authenticated TLS only, where every
// request must come from a configured peer and may only speak for that
// peer (its own endpoints, its own migrations). Nodes share nothing but the
// network: the agent reads and writes only its own state directory and the
// image cache it imports from. It must not reach into another node's
// directories or namespaces.
//
// Migrations are jobs the agent owns (jobs.go): source.go and dest.go are
// the drivers of migration.Source and migration.Dest; each performs the
// actions its machine asks for and feeds back their outcome as events,
// journaling every phase before acting on it. recover.go settles, at
// start, every migration the journal shows unfinished.
//
// Admission (admission.go): a node takes part in at most
// Config.MaxMigrations migrations at once (default 2, incoming and
// outgoing together), so that their images in tmpfs and their
// compression do not get the agent OOM-killed or starve the services.
// A slot is held by a migration, or by a group's unit as a whole (its
// members meet at barriers and must run together, so a group larger
// than the cap still moves). An outgoing migration beyond the cap waits
// before its machine starts, its job "queued" with the reason, first
// come first served, at most 10 minutes; cancelling it then is a plain
// abort. A destination at its cap answers the Prepare with a temporary
// abort (migration.Abort RetryAfterMs), and the source, still before
// anything is frozen, gives its own slot back (two nodes migrating to
// each other would otherwise wait for each other), waits queued and
// asks again. The destination reserves each incoming migration's
// scratch space and memory until it ends (checkScratchSpace): one that
// would fit but for the others' reservations is refused for now in the
// same way; one that could never fit is refused for good. None of this
// runs inside the frozen window. A prepared destination gives up a
// source that sends nothing for Config.SourceSilenceMs (default 5
// minutes) before the freeze, dropping its copy, namespace, reservations
// and claim on the name (journal aborted): TCP's keepalive and
// TCP_USER_TIMEOUT end the connection to a vanished node or over a cut
// link within ~15 s, but not to an agent that stopped or hung with its
// socket open, whose kernel still acknowledges (TestSourceSilentBeforeFreeze).
//
// Every container runs under cgroup limits of memory, tasks and CPU
// (limits.go: `edgehop run --memory --pids --cpus`, defaults 2 GiB, 4096,
// no quota), kept in its meta and sent in the Prepare
// (migration.Process), so the destination's bundle names the same and
// runc's restore applies them to CRIU and the restored tasks.
//
// A group's members migrate as one unit (unit.go): a job each, which
// meet at two barriers, before the freeze and before the commit, so a
// failure up to the commit rolls every member back; the destination
// releases a member only once the members it depends on are restored.
// The last member at the second barrier journals the unit's commit
// (journal.CommitUnit) before any member commits, so a source agent
// restarted between its members' commits hands every member over rather
// than rolling some back (lazy strategies excepted: their pages died with
// the dump). Past the first barrier a member freezes only once the
// members that depend on it (name it in their After) are frozen, and the
// members' connection requests to each other are not held: a web tier
// that opens a database connection per request has it accepted before
// the database freezes, and no connection between them is half-made at
// either dump. CRIU dumps and restores file locks (a database's fcntl
// locks on its data files).
//
// A pod is a group whose members share one network namespace, address
// and link: those of its first member (Process.PodNet names it; meta's
// netOwner and joined), whose migration makes the namespace, link and
// Holder on the destination. On the source the first member to freeze
// (unit.takePodNetwork) does the network's part for all: hold of new
// connections, traffic handover (FreezeNotice.PodNetwork), the frozen hold,
// and from then on a hold of the pod's loopback (netplane.HoldLoopback,
// ended by the last member's migration: unit.memberDone);
// the destination's Holder holds loopback too (netplane.HoldPod), so no
// connection between members meets a member not there yet or any more.
// A destination restores a pod whole or not at all (restoredSet.awaitAll);
// restarted in the middle, its members journaled apart, it settles them
// alike (settlePods). The namespace goes with the last member that uses
// it (releaseNet).
//
// # The frozen window
//
// The network lock is edgehop's, not CRIU's. Every bundle names a CRIU
// configuration (`org.criu.config`) with `network-lock skip`: with iptables-
// nft each CRIU lock or unlock is an `iptables-restore` run of 10–15 ms, and
// a restore with one TCP connection ran eight of them inside the frozen
// window. Instead A holds what arrives for S from the freeze on (below:
// nothing reaches the frozen sockets, and no reset leaves once the dumped
// tasks are gone; a rollback restores into the same namespace and lets it
// in), and
// B's holder keeps packets from the restored sockets until CRIU is done.
// Three more things leave the frozen window: A freezes the cgroup itself
// (not `runc pause`), thawing and refreezing for a moment when a task was
// caught waiting for a vfork child, which ptrace cannot seize (CRIU would
// give up after 10 s with the service frozen); the agents run CRIU's `criu
// check` probes at start; and where `/run` is not a tmpfs (this machine),
// CRIU never saves its kernel feature cache and re-probes the kernel on
// every run (~30 ms), so the agent writes `/run/criu.kdat` itself from a
// `criu check` in a private mount namespace over a tmpfs `/run`, again after
// a reboot or a new CRIU. runc starts before the freeze: A runs `runc
// checkpoint` while S still serves, and runc's CRIU (edgehop-criu, a shim
// in C in front of the real criu; runc.Gate) waits at a gate once runc has
// started, probed CRIU's version (answered by the shim from CRIU's reply
// recorded at start, on both nodes) and prepared the dump; with the
// shim's gate library (runc.GateLibName) the real CRIU has started too
// (its exec and the loading of its shared libraries: 3-7 ms here), read
// runc's request and prepared the dump (its kernel and CPU probes, its
// cgroups: ~3 ms), and waits right before it seizes S's tasks; B's CRIU
// likewise waits right before it reads its first image. A
// freezes S and opens the gate, and calls the dump off (S untouched) on
// any failure before it. This start counts in the migration's prepare
// phase; its dump phase runs from the freeze to CRIU's last image. CRIU
// is done with the images when it writes its last one (stats-dump): A
// ships them from then on while runc removes the dumped container, and
// commits once runc is done. Pre-copy and stop-and-copy do not wait
// that long for a process's memory: pre-copy's final delta starts as the
// gate opens and sends each process's pages as soon as CRIU has written
// them (precopy.DumpWatch); stop-and-copy's images follow its layer delta
// on one stream (imageFeed, transfer.Conn.SendDirAsWritten), each pages
// image and pagemap as CRIU closes it, the rest once CRIU is done. The
// transfer of a many-process service overlaps its dump (the CloudHopper
// web tier's, idle, about 200 ms of a second's transfer at 100 Mbit/s; a
// one-process service gains little, as the compression then shares the
// CPU with CRIU). B writes into pre-copy's images only the pages it did
// not hold at their address; those it held stay in its store, the
// images' parent (precopy.ParentDir), so on 2 cores the dump no longer
// shares the CPU with B copying the state (the web tier's 43,000 held
// pages) and freeing the store's copies. Every strategy
// takes `runc restore`'s start out of the window the other way round
// (migration.ReadyNotice, MsgLiveLayer, FreezeNotice.LayerLive): once its
// own runc waits at the gate, before the freeze, A sends S's
// writable layer (pre-copy's and hybrid's went in the rounds) and runc's
// descriptors.json (written before CRIU's gate); B mounts the root file
// system on them, starts `runc restore`, whose CRIU waits at a gate of
// its own (runc.RestoreOpts Gate), syncs the layer's file system, and
// says when runc waits at the gate (MsgLiveReady): only then does A
// freeze, so neither runc shares the CPU with the dump. In the window A
// sends what changed in the layer since its snapshot before the live
// copy (sendLayerDelta; stop-and-copy and post-copy while CRIU dumps,
// before the images; a snapshot's time is read from the layer's own file
// system, so only entries changed within 50 ms of it are sent again
// whatever its timestamps' granularity). A large file that changed in part (a
// database's redo log, its tables) goes as the 64 KiB blocks that differ
// from what the live copy sent (diffLayer, package blockdiff: A hashed
// each block as it sent it), its entry in the delta an empty stand-in
// with its metadata; B applies the blocks to its copy. B keeps its runc when the delta changes
// nothing (layerMatch.unchanged), rewrites changed files in place when no
// entry is added, removed or replaced (layerMatch.applyInPlace: the
// mounted overlay caches which entries exist, not their contents), and
// otherwise calls its runc
// off (out of the container's cgroups first, so that it removes them at
// once), unmounts (the sync before the freeze left little to write),
// applies the delta and starts runc again at full priority
// (RestoreOpts.Urgent); B switches the network meanwhile (stop-and-copy;
// the other strategies before the state comes); once the images are all
// there B opens the gate (post-copy and hybrid: once the tunnel, whose
// connection to A it dialled as the freeze was announced, the page proxy
// and the lazy-pages daemon started on them) and only CRIU's restore is
// left. B counts the service restored when
// CRIU has resumed its tasks (runc.RestoreOpts.Resumed: CRIU's
// stats-restore), not when runc exits a few ms later; it waits for runc
// before the migration ends, and a runc failing after that leaves the
// running container alone. No tmpfs is left for CRIU to
// tar and untar (4-6 ms each, a side): the masked directories and the
// /sys/fs/cgroup tmpfs are external mounts bound on restore to read-only
// copies made at the agent's start (runc.ExternalMasks,
// runc.ExternalCgroupFS; runc restores in the container's cgroups, so
// that it binds those at /sys/fs/cgroup, not the agent's), and /dev and /dev/shm are directories of the
// writable layer bound there (migration.Process DevInLayer, ShmInLayer;
// runc.MakeDevDir makes /dev as runc would), so their files travel, and
// are pre-copied, with the layer. B's restore is bounded
// (`migration.RestoreDeadline`: 30 s plus 1 s per 32 MiB of images); a hung
// restore is killed and A, waiting 10 s longer, restores S itself.
//
// New connections: CRIU refuses to dump a listening socket with
// connections in its accept queue, and a connection still in its
// handshake would not be dumped at all (its client, sending to B, would be
// reset). Before the freeze A holds every connection request (SYN)
// entering S's namespace (netplane.HoldNew) and waits, the service still
// running, until no connection is in its handshake or an accept queue
// (as long as their number goes down, up to 30 s: a loaded web server
// drains its queue at its own pace; 1 s without progress); one queued
// at the freeze thaws the service until it
// has accepted it. At the commit A forwards the held requests to B
// through the overlay (whole frames on its VXLAN device, with checksums
// the kernel completed), where B holds them with the rest until the
// restore; after a rollback they are let in on A.
//
// At the freeze A does not take S's link down: a hold it set up while S
// still ran (netplane.HoldFrozen: its rules cost an iptables run, which
// stays out of the window) is armed, so every other packet entering S's
// namespace is held, with its contents kept, and what S's frozen sockets
// send is dropped: nothing reaches them, and no reset leaves once the
// dumped tasks are gone, as with the link down. At the commit A takes the
// link down and forwards what the hold kept to B with the connection
// requests. The packets that reach A between the freeze and B's switch of
// the gateways (a round trip or two over the node link) are so neither
// lost nor waited for: before, A waited, frozen, up to 100 ms for B's word
// of the switch before taking the link down, else a client whose request
// was among them waited for its retransmission (1 s). If the hold cannot
// be set up, A does that still (a service that accepted no connection
// does not wait).
//
// CRIU tars every tmpfs of the container on dump and untars it on restore
// (3–5 ms each per side). The same configuration marks the masked
// directories (`/proc/acpi`, `/sys/firmware`, …; `runc.ExternalMasks`) as
// external mounts: they are not dumped, and on restore each is bound to
// `<state>/mask`, an empty tmpfs mounted read-only, so no bind of it can be
// written through. Two host settings matter as much (`make setup` applies
// them; the agent warns at start when they are missing,
// `runc.FrozenWindowHints`): each mount CRIU detaches waits for an RCU grace
// period (`/sys/kernel/rcu_expedited`), and every dump walks the host's
// whole conntrack hash twice, even for an external network namespace
// (`nf_conntrack_buckets` 16384). A warms its zstd encoder before the freeze
// and `--compress auto` takes the rate measured there as its floor: a one-
// chunk probe timed inside the frozen window read the CPU several times too
// slow and left compression off for images that shrink 5–28×.
//
// CRIU's lazy-pages daemon alone asks for one run of pages at a time and
// waits for each reply (a round trip through the tunnel, 6–10 ms here), and
// its background fetch shrinks back to 64 KiB after every fault: a 700 KB
// service took 0.7 s to arrive whole and a 100 MB one 2.4 to 9 s. B's proxy
// (`lazyproxy.ServePrefetch`; for hybrid its upstream's replies also carry
// "you hold this page" flags) asks for every lazy run from the moment the
// state has arrived, while CRIU restores (2 MiB in flight until the first
// fault), and answers the daemon from what arrived (a short reply
// with the leading pages it holds, as the server gives at a run's end; a
// request whose first page is on its way waits for it; only pages nobody
// asked for yet are relayed, so none crosses twice); only pages the dump's
// pagemaps mark lazy are asked for (the page server gives up on any other).
// A fault's request queues behind the prefetch already on its way, and a
// service faults runs of pages one at a time: a 128 MB Redis answered its
// client 0.9–1.2 s after its restore while 16 MiB were kept in flight. So a
// fault that is not on its way puts the pages around it at the head of the
// prefetch, and while faults keep coming (within 100 ms of each other) at
// most 2 MiB is in flight (client-visible downtime 0.4–0.6 s from 64 to
// 640 MB, `bench persistence`).
// The prefetch asks in address order, as the daemon takes pages in the
// background; where the page server's run ends inside a request, the rest
// is asked for next. Left for last, as it once was, each such rest was a
// page the daemon asked for itself, its reply (and every reply behind it)
// waiting for the 16 MiB of prefetch in flight: a 1.2 GB post-copy
// migration crossed 1 Gbit/s at 730 Mbit/s instead of 950 (14.1–14.9 s
// against 10.8–11.1). The prefetch starts when the state has arrived, not
// at the daemon's first request (the restored service's first fault): a
// small service's lazy pages cross while CRIU restores, so its first
// replies wait for no fault (the probe's client-visible gap 137–157 →
// 106–119 ms under post-copy); the restore, sharing the CPU with that
// traffic, takes ~6 ms longer. CRIU's page server takes end of file
// before a CLOSE for a session that succeeded, and a lazy dump then kills
// the dumped tasks; so every hop of a session that ends without a CLOSE
// (B's proxy, the tunnel on both sides, hybrid's source proxy) resets its
// connection instead, the dump fails and CRIU resumes the service on A,
// which a hand-back needs. For the same reason B's proxy holds every
// CLOSE (its own and the daemon's) until the commit is in its journal
// (lazyproxy.PrefetchConfig.Release): a group member restored and served
// whole while another still dumped once ended its session early, CRIU
// killed its tasks and runc removed the container, so a rollback before
// the commit (the source agent's crash) found only page-less images.
// A destination agent that restarts during the lazy phase loses its
// lazy-pages daemon and proxy (the daemon exits on the proxy's reset,
// its userfaultfd closed: a task then faulting a missing page would read
// zeros), and with them the pages still on A. A's page server sees the
// session reset; CRIU then puts the dumped tasks back alive, their memory
// untouched (cr_dump_finish: a failed cr_lazy_mem_dump leaves them
// TASK_ALIVE), and `runc checkpoint` fails without destroying them
// ("container still running"; runc 1.1's deferred destroy refuses a
// running or paused container). The restarted B freezes its copy and
// asks A (migration.ActAskSourcePages): A's journal done (every page
// served) keeps it; A holding the tasks again (PeerPhase.Holds: no runc
// works on the container and runc still knows it) destroys it, journaled
// aborted. A, asking B meanwhile (ActCheckDest), takes the service back
// only on that definitive answer (B's record aborted, its container
// gone): thawed, its connections out of repair mode, the traffic pointed
// back here, rolled back with all its data. What B's copy answered after
// its restore is lost with it, and a client that talked to it meanwhile
// finds its connection's sequence numbers behind (an idle one keeps its
// connection, TestKillDestinationDuringLazyPhase). Only if A cannot take
// it back is the migration lost, never ok.
// Both ends of CRIU's page-server session cork their sockets, and the
// daemon's CLOSE and the server's answer to it each waited out the kernel's
// 200 ms cork timeout; the proxy closes the session itself once the daemon
// holds every lazy page, and half-closes after every CLOSE so the server
// ends at once.
//
// Which memory path runs where: the live rounds need `process_vm_readv` and
// read `/proc/PID/pagemap` (with `PAGEMAP_SCAN`, Linux ≥ 6.7, zero pages are
// recognised; older kernels fall back to pagemap entries). They never need
// soft-dirty bits, so they work on this kernel, where `criu pre-dump`
// aborts. Correctness does not rest on the rounds: the final comparison is
// against the frozen CRIU dump, so a page written during a round is simply
// sent then. The kernel's soft-dirty pre-dump and userfaultfd write-protect
// tracking are not used.
//
// The writable layer: a snapshot (inode, size, mode, mtime, ctime) is taken
// before the live copy; the frozen window sends every entry whose snapshot
// differs or whose ctime was within a second of the first (file-system
// clocks are coarse), hard-linked into a hidden delta tree, plus the list of
// every entry, and B removes what is gone and renames the delta in.
//
// `--strategy auto` asks the performance model (`model.Plan`) with the
// container's memory (its memory cgroup) and the narrower link's bandwidth,
// and passes the planned iterations as pre-copy's rounds. `--compress auto`
// (the default) compresses a chunk only while zstd beats the path's link
// rate. Every result (phases, CRIU statistics, rounds, bytes on the wire,
// held packets) is appended to the node's `migrations.jsonl` and can be
// fitted by `edgehop model fit`. The `network` phase runs concurrently with
// the dump, so phases add up to more than the total.
//
// Hybrid (`--strategy hybrid`) runs the live rounds, then dumps lazily like
// post-copy, but B's `criu lazy-pages` talks to a proxy (`lazyproxy`) that
// relays CRIU's page-server protocol through the tunnel to a proxy on A in
// front of CRIU's page server. For every page CRIU serves, A's proxy checks
// its hash against what the rounds left on B and sends one flag byte instead
// of the page when B holds exactly that content at that address; B's proxy
// fills it from its store. Only what changed after the last round crosses
// the link after the freeze, and the downtime is post-copy's.
package agent
