package bench

// WindowPart is one part of edgehop's frozen window over a path's runs:
// its median and what it is made of.
type WindowPart struct {
	Part  string  `json:"part"`
	P50Ms float64 `json:"p50_ms"`
	What  string  `json:"what"`
}

// frozenWindow splits the frozen window of the successful runs that have
// CRIU's statistics (stop-and-copy and pre-copy dumps) into what CRIU
// itself spends and the rest of each phase; without such runs, that of the
// lazy strategies' runs (lazyWindow). nil when there are none.
func frozenWindow(runs []Migration) []WindowPart {
	var criuDump, dumpRest, transfer, criuRestore, runcRestore, restoreRest, network []float64
	for _, r := range runs {
		frozen, fok := r.CRIU["frozen_time_us"]
		restore, rok := r.CRIU["restore_time_us"]
		if !r.OK || !fok || !rok {
			continue
		}
		criuDump = append(criuDump, frozen/1000)
		dumpRest = append(dumpRest, r.PhasesMs["dump"]-frozen/1000)
		transfer = append(transfer, r.PhasesMs["transfer"])
		criuRestore = append(criuRestore, restore/1000)
		if r.Restore != nil && r.Restore.RestoreMs > 0 {
			runcRestore = append(runcRestore, r.Restore.RestoreMs-restore/1000)
			restoreRest = append(restoreRest, r.PhasesMs["restore"]-r.Restore.RestoreMs)
		} else {
			restoreRest = append(restoreRest, r.PhasesMs["restore"]-restore/1000)
		}
		network = append(network, r.PhasesMs["network"])
	}
	if len(criuDump) == 0 {
		return lazyWindow(runs)
	}
	parts := []WindowPart{
		{"dump: CRIU", p50(criuDump), "CRIU's own frozen time (its stats-dump): seizing the tasks, their memory, files, sockets in TCP repair; no tmpfs is tarred (the cgroup tmpfs is external, /dev and /dev/shm are layer directories)"},
		{"dump: the rest", p50(dumpRest), "the freeze (cgroup freezer), the network switch's word for a service that accepts connections, the node-side veth down, the gate's opening, CRIU's work after its frozen time, and the agent seeing its last image; runc and CRIU start before the freeze (the migration's prepare phase), where CRIU also reads its request and prepares (options, its kernel and CPU probes, each CPUID a VM exit here, its cgroups) and waits at the gate as it would seize the tasks, and runc finishes while the images travel (a stop-and-copy destination's runc waits at its gate from before the freeze)"},
		{"transfer", p50(transfer), "the source sending the images on the migration connection (zstd when it pays), until its socket took the last byte; stop-and-copy's writable layer crossed before the freeze, its delta and each process's pages while CRIU dumped (pre-copy's pages too), the other strategies send the delta here"},
		{"restore: CRIU", p50(criuRestore), "CRIU's own restore time (its stats-restore): namespaces, mounts, memory, files, TCP repair"},
	}
	if len(runcRestore) == len(criuRestore) {
		parts = append(parts,
			WindowPart{"restore: runc", p50(runcRestore), "the destination's `runc restore` outside CRIU, from the last image on until CRIU resumed the tasks (runc.RestoreOpts.Resumed): the gate's opening (the images moved into place, interrupted waits rewritten), CRIU's reading of its first images before its restore time starts, runc's state written at CRIU's post-restore notification (runc's start, CRIU's exec with the gate library, its request and its kernel and CPU probes, and mounting the root file system happened before the freeze, on the live layer; runc's exit comes after the service runs again); without the criu shim, runc starts here and its exit counts"},
			WindowPart{"restore: the rest", p50(restoreRest), "the images' last bytes crossing the link and the destination's report coming back (the other strategies: also mounting the root file system, the report's mount_ms)"})
	} else {
		parts = append(parts, WindowPart{"restore: the rest", p50(restoreRest), "the images' last bytes crossing the link, mounting the root file system (stop-and-copy: done before the freeze), `runc restore` outside CRIU, and the destination's report coming back"})
	}
	return append(parts, WindowPart{"network", p50(network), "held packets released and the switch completed (mostly done during the dump)"})
}

// lazyWindow is frozenWindow for post-copy and hybrid: CRIU writes a lazy
// dump's statistics only once its pages are all served, long after the
// window, so the dump is one part. nil without successful lazy runs that
// have CRIU's restore statistics and the destination's account.
func lazyWindow(runs []Migration) []WindowPart {
	var dump, transfer, criuRestore, runcRestore, restoreRest, network []float64
	for _, r := range runs {
		restore, rok := r.CRIU["restore_time_us"]
		_, lazy := r.PhasesMs["lazy"]
		if !r.OK || !rok || !lazy || r.Restore == nil || r.Restore.RestoreMs <= 0 {
			continue
		}
		dump = append(dump, r.PhasesMs["dump"])
		transfer = append(transfer, r.PhasesMs["transfer"])
		criuRestore = append(criuRestore, restore/1000)
		runcRestore = append(runcRestore, r.Restore.RestoreMs-restore/1000)
		restoreRest = append(restoreRest, r.PhasesMs["restore"]-r.Restore.RestoreMs)
		network = append(network, r.PhasesMs["network"])
	}
	if len(dump) == 0 {
		return nil
	}
	return []WindowPart{
		{"dump: CRIU's lazy dump", p50(dump), "the freeze, the gate's opening and CRIU's lazy dump until its page server is ready: seizing the tasks, their files and sockets in TCP repair, and every page of the service moved into pipes for the page server (none written; CRIU's own share is not split out, as its statistics come only once the pages are all served)"},
		{"transfer", p50(transfer), "the source sending the images without pages on the migration connection; post-copy's writable layer crossed before the freeze and its delta while CRIU dumped, hybrid's delta crosses here"},
		{"restore: CRIU", p50(criuRestore), "CRIU's own restore time (its stats-restore): namespaces, mounts, memory areas registered with userfaultfd (no pages), files, TCP repair"},
		{"restore: runc", p50(runcRestore), "the destination's `runc restore --lazy-pages` outside CRIU, from the gate's opening until CRIU resumed the tasks: the images' interrupted waits rewritten, CRIU's reading of its first images before its restore time starts, its handing the memory to the lazy-pages daemon, runc's state written at CRIU's post-restore notification (runc's start, CRIU's with its request and probes, and the root file system's mount happened before the freeze, on the live layer)"},
		{"restore: the rest", p50(restoreRest), "the images' last bytes crossing the link, the page tunnel (dialled as the freeze was announced), page proxy and lazy-pages daemon starting on them, and the destination's report coming back"},
		{"network", p50(network), "held packets released and the switch completed (done while the source dumped)"},
	}
}

// p50 is the median of v.
func p50(v []float64) float64 { return Summarize(v).P50 }
