package migration

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// Strategy is how memory state moves.
type Strategy string

// The strategies edgehop implements.
const (
	StopAndCopy Strategy = "stop-and-copy" // freeze, dump everything, ship, restore
	PostCopy    Strategy = "post-copy"     // freeze, dump without pages, restore, pull pages lazily
	PreCopy     Strategy = "pre-copy"      // live rounds while running, then freeze and send only the delta
	Hybrid      Strategy = "hybrid"        // live rounds, then post-copy for what changed since
	Auto        Strategy = "auto"          // the planner chooses
)

// Strategies lists the strategies a migration can be asked for.
func Strategies() []Strategy { return []Strategy{StopAndCopy, PostCopy, PreCopy, Hybrid, Auto} }

// Lazy reports whether the strategy restores before all pages arrived.
func (s Strategy) Lazy() bool { return s == PostCopy || s == Hybrid }

// Live reports whether the strategy copies memory while the service runs.
func (s Strategy) Live() bool { return s == PreCopy || s == Hybrid }

// ParseStrategy validates a strategy name.
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return StopAndCopy, nil
	}
	names := make([]string, 0, 5)
	for _, st := range Strategies() {
		if string(st) == s {
			return st, nil
		}
		names = append(names, string(st))
	}
	return "", fmt.Errorf("unknown strategy %q (%s)", s, strings.Join(names, ", "))
}

// Phase names, in the order a migration passes them.
const (
	PhasePrepare  = "prepare"  // destination namespace, IP/MAC, lock chain, rootfs; the dump's runc and CRIU started at their gate
	PhasePrecopy  = "precopy"  // live rounds and the writable layer, service running
	PhaseReserve  = "reserve"  // waiting for the memory the dump will need to be touched
	PhaseDump     = "dump"     // from the freeze to CRIU's last image on the source
	PhaseTransfer = "transfer" // images and writable layer to the destination
	PhaseRestore  = "restore"  // CRIU restore on the destination
	PhaseNetwork  = "network"  // FDB switch on every node
	PhaseCommit   = "commit"   // ownership handed to the destination
	PhaseCleanup  = "cleanup"  // source released
	PhaseLazy     = "lazy"     // post-copy: remaining pages pulled after restore
	PhaseRollback = "rollback" // service restored on the source after a failure
)

// Request asks the source agent to migrate a container.
type Request struct {
	To       string   `json:"to"`
	Strategy Strategy `json:"strategy"`
	// Rounds caps the live rounds of pre-copy and hybrid (PAM's I plus the
	// first full copy); 0 means DefaultRounds.
	Rounds int `json:"rounds,omitempty"`
	// Compression of the state streams: "off", "zstd" or "auto" (zstd
	// only while it raises throughput on a link of LinkBps); "" is auto.
	Compression string `json:"compression,omitempty"`
	// LinkBps is the bit rate of the path to the destination, for
	// auto compression; 0 assumes 1 Gbit/s.
	LinkBps int64 `json:"link_bps,omitempty"`
	// MaxFrozenMs bounds the frozen window: when it runs out before the
	// commit the service is rolled back on the source. 0 means
	// FrozenBudget's default for the state's size.
	MaxFrozenMs int64 `json:"max_frozen_ms,omitempty"`
}

// FrozenBudget is the default bound of the frozen window for stateBytes
// over a link of linkBps (0: 1 Gbit/s): twice the transfer time at line
// rate plus the restore's own deadline. A probe gets 30 s, 1.2 GB about
// 85 s; a cut link or a hung peer then costs that much downtime, not the
// caller's patience.
func FrozenBudget(stateBytes, linkBps int64) time.Duration {
	if linkBps <= 0 {
		linkBps = 1_000_000_000
	}
	transfer := time.Duration(float64(max(stateBytes, 0)) * 8 / float64(linkBps) * float64(time.Second))
	return 2*transfer + RestoreDeadline(stateBytes)
}

// DefaultRounds caps live rounds when the request does not.
const DefaultRounds = 6

// RestoreDeadline bounds the destination's restore of stateBytes of
// images: a restore that takes longer is taken as hung, and the service
// goes back to the source. CRIU restores from tmpfs at well over 100
// MB/s; the bound allows a fixed 30 s plus 1 s per 32 MiB.
func RestoreDeadline(stateBytes int64) time.Duration {
	return 30*time.Second + time.Duration(max(stateBytes, 0)>>25)*time.Second
}

// RestoreGrace is how much longer than RestoreDeadline the source waits
// for the destination's answer, so that a destination giving up is heard
// with its reason.
const RestoreGrace = 10 * time.Second

// Precopy reports the live rounds of a pre-copy or hybrid migration.
type Precopy struct {
	Rounds       []Round `json:"rounds"`
	StopReason   string  `json:"stop_reason"`
	LayerBytes   int64   `json:"layer_bytes"`   // writable layer sent while running
	LayerChanged int     `json:"layer_changed"` // its entries sent again in the frozen window
	// Final round (pre-copy): pages in the dump, and how many of them the
	// destination held already, as a copy elsewhere, as zero, or needed.
	DumpPages int64 `json:"dump_pages,omitempty"`
	HeldPages int64 `json:"held_pages,omitempty"`
	CopyPages int64 `json:"copy_pages,omitempty"`
	ZeroPages int64 `json:"zero_pages,omitempty"`
	DataPages int64 `json:"data_pages,omitempty"`
	// XorPages of the DataPages went as their XOR with the page the
	// destination held (precopy's shadow copies).
	XorPages   int64 `json:"xor_pages,omitempty"`
	FinalBytes int64 `json:"final_bytes,omitempty"`
	// FinalImages counts the dump's pages images, FinalEarly those sent
	// while CRIU was still dumping (precopy.DumpWatch).
	FinalImages int `json:"final_images,omitempty"`
	FinalEarly  int `json:"final_early,omitempty"`
	// Lazy pages (hybrid): served from the destination's copy vs sent.
	LazyHeldPages int64 `json:"lazy_held_pages,omitempty"`
	LazyDataPages int64 `json:"lazy_data_pages,omitempty"`
}

// Round is one live round.
type Round struct {
	Pages        int64   `json:"pages"`
	ChangedPages int64   `json:"changed_pages"`
	XorPages     int64   `json:"xor_pages,omitempty"`
	Bytes        int64   `json:"bytes_on_wire"`
	Ms           float64 `json:"ms"`
}

// Result is what a migration recorded.
type Result struct {
	ID           string             `json:"id"`
	Container    string             `json:"container"`
	From         string             `json:"from"`
	To           string             `json:"to"`
	Strategy     Strategy           `json:"strategy"`
	OK           bool               `json:"ok"`
	Error        string             `json:"error,omitempty"`
	RolledBack   bool               `json:"rolled_back,omitempty"`
	DowntimeMs   float64            `json:"downtime_ms"`
	TotalMs      float64            `json:"total_ms"`
	SourceFreeMs float64            `json:"source_free_ms"` // until the source holds nothing of the service
	PhasesMs     map[string]float64 `json:"phases_ms"`
	BytesOnWire  int64              `json:"bytes_on_wire"`
	HeldPackets  int                `json:"held_packets"` // client packets held during the downtime and delivered after restore
	// ForwardedConnections counts the connection requests the source held
	// from just before the freeze and forwarded to the destination.
	ForwardedConnections int `json:"forwarded_connections,omitempty"`
	// ForwardedPackets counts the other packets for the service that
	// reached the source while it was frozen, held there and forwarded
	// (netplane.HoldFrozen).
	ForwardedPackets int   `json:"forwarded_packets,omitempty"`
	StateBytes       int64 `json:"state_bytes"` // payload: images + writable layer
	// LayerPatched counts the writable layer's files that crossed in the
	// frozen window as their blocks changed since the live copy,
	// LayerPatchBytes those blocks' bytes.
	LayerPatched    int   `json:"layer_patched,omitempty"`
	LayerPatchBytes int64 `json:"layer_patch_bytes,omitempty"`
	// ImagesEarly counts stop-and-copy's images (processes' pages and
	// pagemaps) sent while CRIU went on dumping.
	ImagesEarly int  `json:"images_early,omitempty"`
	Compressed  bool `json:"compressed"`
	// CompressionNote says why auto compression was on or off.
	CompressionNote string             `json:"compression_note,omitempty"`
	CRIU            map[string]float64 `json:"criu,omitempty"`
	// Destination is the destination's own account of its part of the
	// frozen window; nil when it never restored.
	Destination *RestoreReport `json:"destination,omitempty"`
	Precopy     *Precopy       `json:"precopy,omitempty"`
	Started     time.Time      `json:"started"`
	// Outcome is how the migration ended (ok, aborted, rolled-back, lost).
	Outcome   Outcome `json:"outcome,omitempty"`
	Recovered bool    `json:"recovered,omitempty"` // settled by an agent that restarted mid-migration
}

// UnitResult folds the results of a unit's members (a group's or pod's
// jobs, one per member) into the unit's. The unit moved only if every
// member did; its downtime is the longest member's, with that member's
// phases; its total time the longest; bytes and forwarded connections add
// up; its outcome is the first failing member's, and its error names
// each failing member. One result is returned as it is; none is a failure.
func UnitResult(members []Result) Result {
	if len(members) == 1 {
		return members[0]
	}
	res := Result{OK: len(members) > 0}
	var errs []string
	for i, r := range members {
		if i == 0 {
			res.ID, res.From, res.To, res.Strategy, res.Started = r.ID, r.From, r.To, r.Strategy, r.Started
		}
		if r.DowntimeMs >= res.DowntimeMs {
			res.DowntimeMs, res.PhasesMs = r.DowntimeMs, r.PhasesMs
		}
		res.TotalMs = max(res.TotalMs, r.TotalMs)
		res.SourceFreeMs = max(res.SourceFreeMs, r.SourceFreeMs)
		res.BytesOnWire += r.BytesOnWire
		res.StateBytes += r.StateBytes
		res.HeldPackets += r.HeldPackets
		res.ForwardedConnections += r.ForwardedConnections
		res.ForwardedPackets += r.ForwardedPackets
		if res.Outcome == "" || (!r.OK && res.OK) {
			res.Outcome = r.Outcome
		}
		if !r.OK {
			res.OK = false
			errs = append(errs, r.Container+": "+r.Error)
		}
	}
	if len(members) == 0 {
		errs = append(errs, "no member migrated")
	}
	res.Error = strings.Join(errs, "; ")
	res.RolledBack = res.Outcome == OutcomeRolledBack
	return res
}

// Timer records consecutive phases. Not safe for concurrent use.
type Timer struct {
	start   time.Time
	last    time.Time
	now     func() time.Time
	phases  map[string]float64
	frozeAt time.Time
}

// NewTimer starts a timer; now is the clock (time.Now when nil).
func NewTimer(now func() time.Time) *Timer {
	if now == nil {
		now = time.Now
	}
	t := now()
	return &Timer{start: t, last: t, now: now, phases: map[string]float64{}}
}

// Mark ends the current phase under name and starts the next one.
func (t *Timer) Mark(name string) {
	n := t.now()
	t.phases[name] += float64(n.Sub(t.last).Microseconds()) / 1000
	t.last = n
}

// Add records a phase measured elsewhere (e.g. by the destination).
func (t *Timer) Add(name string, ms float64) { t.phases[name] += ms }

// Freeze notes the moment the service stopped serving.
func (t *Timer) Freeze() { t.frozeAt = t.now() }

// Downtime is the time since Freeze.
func (t *Timer) Downtime() time.Duration {
	if t.frozeAt.IsZero() {
		return 0
	}
	return t.now().Sub(t.frozeAt)
}

// Elapsed is the time since the timer started.
func (t *Timer) Elapsed() time.Duration { return t.now().Sub(t.start) }

// Phases returns a copy of the recorded phases.
func (t *Timer) Phases() map[string]float64 {
	out := make(map[string]float64, len(t.phases))
	for k, v := range t.phases {
		out[k] = v
	}
	return out
}

// Ms converts a duration to float milliseconds.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Messages between source (S) and destination (D) agents, in order.
const (
	MsgPrepare  = "prepare"  // S→D Prepare
	MsgPrepared = "prepared" // D→S {}
	MsgLayer    = "layer"    // S→D LayerNotice: pre-copy: the writable layer follows, service running
	// MsgLiveLayer (S→D LiveLayer): to a gated restore, the service
	// running: stop-and-copy's writable layer (pre-copy's came in the
	// rounds), then runc's descriptors.json, follow; in the frozen window
	// only the layer's delta comes.
	MsgLiveLayer = "live-layer"
	// MsgLiveReady (D→S {}): the restore started on the live layer waits
	// at its gate; the source freezes only then, so that runc's start
	// does not share the CPU with the dump.
	MsgLiveReady = "live-ready"
	MsgRound     = "round"    // S→D RoundStart: pre-copy: a live round's stream follows
	MsgStored    = "stored"   // D→S RoundStart: the round is in the destination's store
	MsgFrozen    = "frozen"   // S→D FreezeNotice: the source freezes now; D takes the traffic and holds it
	MsgCommit    = "commit"   // S→D {}, right behind the state: S journaled the commit; D serves once restored
	MsgSwitched  = "switched" // D→S Switched: D committed and delivered the held packets
	// MsgAbort goes either way: the sender gives up. From D after the
	// commit it hands the service back: D's copy is gone, S resumes it.
	MsgAbort = "abort"
)

// Prepare describes the service so the destination can get ready before
// the freeze.
type Prepare struct {
	// ID is the migration's id, the same in both sides' journals.
	ID     string   `json:"id"`
	Name   string   `json:"name"`
	Image  string   `json:"image"`
	Digest string   `json:"digest"` // the exact image the service runs from
	IP     string   `json:"ip"`
	MAC    string   `json:"mac"`
	Args   []string `json:"args"`
	Env    []string `json:"env"`
	Cwd    string   `json:"cwd"`
	Process
	// Unit identifies a group's migration, the same for every member's
	// Prepare, and Members names them all: a member is released only
	// once those of them it depends on are restored here.
	Unit     string   `json:"unit,omitempty"`
	Members  []string `json:"members,omitempty"`
	Strategy Strategy `json:"strategy"`
	From     string   `json:"from"`
	// MemoryBytes is the service's resident memory, for the destination
	// to ready that much (agent.reserveFor).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// PageServer is where the destination's lazy-pages daemon reaches the
	// source's pages (post-copy): a loopback address on the source, reached
	// through an authenticated tunnel opened with PageToken.
	PageServer string `json:"page_server,omitempty"`
	PageToken  string `json:"page_token,omitempty"`
}

// ReadyNotice is the destination's answer to Prepare. GatedRestore: it can
// start its restore before the images arrive: runc starts on the writable
// layer and descriptors.json, CRIU once the images are there (a lazy
// strategy's, once its pages are served).
type ReadyNotice struct {
	GatedRestore bool `json:"gated_restore,omitempty"`
}

// LiveLayer precedes what MsgLiveLayer sends: the writable layer first
// when Layer (the strategies without live rounds), then runc's
// descriptors.json.
type LiveLayer struct {
	Layer bool `json:"layer,omitempty"`
}

// LayerNotice precedes pre-copy's live writable layer (MsgLayer): Bytes
// is the size of its regular files as the source counts them before
// sending, which bounds what the destination accepts (twice it plus a
// margin: the layer changes while it is sent). A source before it sent
// {}: Bytes 0, the margin alone.
type LayerNotice struct {
	Bytes int64 `json:"bytes,omitempty"`
}

// FreezeNotice announces the freeze. Accepting: the service accepts new
// connections, and its source takes its link down only once it hears of
// the network switch, so the destination tells the gateways first.
// PodNetwork: the service is the first of its pod to freeze, and its
// destination takes the pod's traffic (the others' do not). LayerLive:
// the layer (pre-copy's: in the rounds) and descriptors.json came before
// the freeze (MsgLiveLayer; the destination said GatedRestore), and only
// the layer's delta comes in the window. LayerFirst (stop-and-copy and
// post-copy, with LayerLive): that delta comes first, sent while CRIU dumps, and the
// images after it.
type FreezeNotice struct {
	Accepting  bool `json:"accepting,omitempty"`
	PodNetwork bool `json:"pod_network,omitempty"`
	LayerFirst bool `json:"layer_first,omitempty"`
	LayerLive  bool `json:"layer_live,omitempty"`
}

// Process is what a service's image says of its process beyond its
// command line, kept with the service wherever it runs: its user (as
// declared, and as resolved in the image's own /etc/passwd and
// /etc/group), its stop signal, its exposed ports and its volumes.
type Process struct {
	User       string   `json:"user,omitempty"`
	UID        uint32   `json:"uid,omitempty"`
	GID        uint32   `json:"gid,omitempty"`
	Groups     []uint32 `json:"groups,omitempty"`
	StopSignal string   `json:"stop_signal,omitempty"`
	Ports      []string `json:"ports,omitempty"`
	// Volumes are the image's volume paths; volume i's data lives in
	// the writable layer's VolumeDir(i), bound at the path, so it
	// travels (and is pre-copied) with the layer.
	Volumes []string `json:"volumes,omitempty"`
	// ShmInLayer: the service's /dev/shm is the writable layer's ShmDir,
	// bound there, so its files travel (and are pre-copied) with the
	// layer rather than through CRIU's tar of a tmpfs. Services created
	// before it have a tmpfs /dev/shm, which they keep.
	ShmInLayer bool `json:"shm_in_layer,omitempty"`
	// DevInLayer: likewise its /dev is the writable layer's DevDir, made
	// by the agent as runc makes a tmpfs /dev (runc.MakeDevDir). Only on
	// a node whose state directory allows device nodes.
	DevInLayer bool `json:"dev_in_layer,omitempty"`
	// Group is the application the service belongs to (it migrates with
	// the group's other members as one unit), After the members it
	// depends on.
	Group string   `json:"group,omitempty"`
	After []string `json:"after,omitempty"`
	// PodNet makes the service a member of the pod Group: the members
	// share one network namespace, address and link, those of the member
	// PodNet names (the pod's first, which names itself).
	PodNet string `json:"pod_net,omitempty"`
	// CapAdd are the capabilities the service was run with beyond
	// runc.DefaultCapabilities (`edgehop run --cap-add`), canonical
	// names; the destination restores it with the same set.
	CapAdd []string `json:"cap_add,omitempty"`
	// MemoryLimit (bytes), PidsLimit and CPUMillis (thousandths of a
	// CPU) are the service's cgroup limits (`edgehop run --memory
	// --pids --cpus`); the destination restores it under the same (runc
	// restore applies the bundle's resources to CRIU and the restored
	// tasks). Zero: none, as for services made before limits existed.
	MemoryLimit int64 `json:"memory_limit,omitempty"`
	PidsLimit   int64 `json:"pids_limit,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
}

// VolumesDir is the directory of a writable layer that holds a
// container's volumes; the container never sees it (it is masked, as
// runc.MaskedDirs lists).
const VolumesDir = ".edgehop-volumes"

// ShmDir is the directory of a writable layer bound at the service's
// /dev/shm (Process.ShmInLayer).
const ShmDir = VolumesDir + "/shm"

// DevDir is the directory of a writable layer bound at the service's /dev
// (Process.DevInLayer).
const DevDir = VolumesDir + "/dev"

// VolumeDir is volume i's directory relative to the writable layer.
func VolumeDir(i int) string { return VolumesDir + "/" + strconv.Itoa(i) }

// ValidVolume checks a volume path an image declares: absolute, clean,
// not the root and outside the kernel's file systems and the volumes'
// own directory.
func ValidVolume(v string) error {
	if !path.IsAbs(v) || path.Clean(v) != v || v == "/" || len(v) > 4096 {
		return fmt.Errorf("volume %q: want a clean absolute path other than /", v)
	}
	for _, no := range []string{"/proc", "/sys", "/dev", "/" + VolumesDir} {
		if v == no || strings.HasPrefix(v, no+"/") {
			return fmt.Errorf("volume %q: not under %s", v, no)
		}
	}
	return nil
}

// MaxVolumes bounds the volumes of one container.
const MaxVolumes = 32

// RestoreReport is the destination's account of its restore.
type RestoreReport struct {
	RestoreMs float64            `json:"restore_ms"`        // runc restore, CRIU's included, until the tasks run again
	NetworkMs float64            `json:"network_ms"`        // the switch, done while the source dumped
	LazyMs    float64            `json:"lazy_ms,omitempty"` // post-copy: restore until the last page arrived
	RecvMs    float64            `json:"recv_ms"`           // receiving images and layer
	MountMs   float64            `json:"mount_ms"`          // the root filesystem's overlay
	CRIU      map[string]float64 `json:"criu,omitempty"`
	// LiveLayer says what became of the restore started on a live layer
	// (FreezeNotice.LayerLive): the layer's delta changed nothing
	// ("kept"), changed files only and was written in place
	// ("rewritten"), or added, removed or replaced entries, so the
	// restore started again on the new layer ("restarted").
	LiveLayer string `json:"live_layer,omitempty"`
}

// Switched reports the destination's network switch.
type Switched struct {
	NetworkMs float64 `json:"network_ms"`
	// Held is how many packets the destination held from the freeze
	// until the commit and then delivered.
	Held int `json:"held"`
	// Restore is the destination's account of its part of the frozen
	// window.
	Restore RestoreReport `json:"restore"`
}

// Abort carries the reason a side gave up.
type Abort struct {
	Reason string `json:"reason"`
	// RetryAfterMs, when not zero, says the refusal is temporary (the
	// destination is at its cap of concurrent migrations, or its scratch
	// space is reserved by others): the source waits that long and asks
	// again, its service untouched.
	RetryAfterMs int `json:"retry_after_ms,omitempty"`
}

// RoundStart announces a live round (MsgRound).
type RoundStart struct {
	Round int `json:"round"`
}
