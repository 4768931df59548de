package runc_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/edgehop/edgehop/internal/runc"
)

func TestWriteBundle(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "b")
	extra := specs.Mount{Destination: "/data", Type: "tmpfs", Source: "tmpfs"}
	s := runc.Spec{
		Rootfs:         "/srv/rootfs",
		Args:           []string{"redis-server", "--port", "6379"},
		Env:            []string{"A=1"},
		Hostname:       "probe1",
		NetNSPath:      "/var/lib/edgehop/nodes/n0/netns/probe1",
		ReadonlyRootfs: true,
		Mounts:         []specs.Mount{extra},
		MemoryLimit:    64 << 20,
		PidsLimit:      100,
		CPUMillis:      1500,
		CgroupsPath:    "/edgehop/tb/n0/probe1",
	}
	if err := runc.WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got specs.Spec
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	p := got.Process
	if p == nil || p.Terminal || p.Cwd != "/" || !slices.Equal(p.Args, s.Args) || !p.NoNewPrivileges {
		t.Errorf("process %+v", p)
	}
	if !slices.Equal(p.Env, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "A=1"}) {
		t.Errorf("env %v, want a default PATH first", p.Env)
	}
	if !slices.Equal(p.Capabilities.Bounding, runc.DefaultCapabilities) {
		t.Errorf("capabilities %v", p.Capabilities.Bounding)
	}
	if got.Root.Path != s.Rootfs || !got.Root.Readonly || got.Hostname != "probe1" {
		t.Errorf("root %+v hostname %q", got.Root, got.Hostname)
	}
	var types []specs.LinuxNamespaceType
	for _, ns := range got.Linux.Namespaces {
		types = append(types, ns.Type)
		if ns.Type == specs.NetworkNamespace && ns.Path != s.NetNSPath {
			t.Errorf("network namespace path %q, want %q", ns.Path, s.NetNSPath)
		}
		if ns.Type != specs.NetworkNamespace && ns.Path != "" {
			t.Errorf("namespace %s joins %q, want a new one", ns.Type, ns.Path)
		}
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace} {
		if !slices.Contains(types, want) {
			t.Errorf("namespaces %v lack %s", types, want)
		}
	}
	if slices.Contains(types, specs.UserNamespace) {
		t.Error("user namespace set")
	}
	var dests []string
	for _, m := range got.Mounts {
		dests = append(dests, m.Destination)
	}
	if !slices.Equal(dests, []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup", "/data"}) {
		t.Errorf("mounts %v", dests)
	}
	if shm := got.Mounts[3]; shm.Type != "tmpfs" {
		t.Errorf("/dev/shm %+v, want a tmpfs", shm)
	}
	withShm := s
	withShm.ShmDir = "/layer/shm"
	if c, err := withShm.Config(); err != nil {
		t.Error(err)
	} else if shm := c.Mounts[3]; shm.Destination != "/dev/shm" || shm.Type != "bind" || shm.Source != "/layer/shm" || !slices.Contains(shm.Options, "nodev") {
		t.Errorf("/dev/shm with ShmDir %+v, want a nodev bind of /layer/shm", shm)
	}
	withShm.DevDir = "/layer/dev"
	if c, err := withShm.Config(); err != nil {
		t.Error(err)
	} else if dev := c.Mounts[1]; dev.Destination != "/dev" || dev.Type != "bind" || dev.Source != "/layer/dev" || slices.Contains(dev.Options, "nodev") {
		t.Errorf("/dev with DevDir %+v, want a bind of /layer/dev that allows devices", dev)
	}
	withShm.ShmDir = "layer/shm"
	if _, err := withShm.Config(); err == nil {
		t.Error("a relative ShmDir was accepted")
	}
	if got.Linux.Resources.Memory == nil || *got.Linux.Resources.Memory.Limit != 64<<20 {
		t.Errorf("memory %+v", got.Linux.Resources.Memory)
	}
	if p := got.Linux.Resources.Pids; p == nil || p.Limit == nil || *p.Limit != 100 {
		t.Errorf("pids %+v", p)
	}
	if c := got.Linux.Resources.CPU; c == nil || c.Quota == nil || *c.Quota != 150_000 || c.Period == nil || *c.Period != 100_000 {
		t.Errorf("cpu %+v, want a quota of 150 ms per 100 ms", c)
	}
	if got.Linux.CgroupsPath != s.CgroupsPath || !slices.Contains(got.Linux.MaskedPaths, "/proc/kcore") {
		t.Errorf("cgroups path %q masked %v", got.Linux.CgroupsPath, got.Linux.MaskedPaths)
	}

	// Rewriting replaces the file and leaves no temporary behind.
	s.NetNSPath = "/other"
	if err := runc.WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("bundle holds %d files, want config.json only", len(ents))
	}
	data, _ = os.ReadFile(filepath.Join(dir, "config.json"))
	if !strings.Contains(string(data), `"/other"`) {
		t.Error("rewritten config.json lacks the new namespace path")
	}
}

func TestSpecValidate(t *testing.T) {
	ok := runc.Spec{Rootfs: "/r", Args: []string{"sh"}}
	tests := []struct {
		name   string
		change func(*runc.Spec)
		want   string // substring of the error; "" for valid
	}{
		{"valid", func(*runc.Spec) {}, ""},
		{"relative rootfs", func(s *runc.Spec) { s.Rootfs = "rootfs" }, "rootfs"},
		{"no rootfs", func(s *runc.Spec) { s.Rootfs = "" }, "rootfs"},
		{"no args", func(s *runc.Spec) { s.Args = nil }, "args"},
		{"relative cwd", func(s *runc.Spec) { s.Cwd = "srv" }, "cwd"},
		{"relative netns", func(s *runc.Spec) { s.NetNSPath = "netns/x" }, "netns"},
		{"negative memory", func(s *runc.Spec) { s.MemoryLimit = -1 }, "memory"},
		{"negative pids", func(s *runc.Spec) { s.PidsLimit = -1 }, "pids"},
		{"cpu quota below the kernel's minimum", func(s *runc.Spec) { s.CPUMillis = 5 }, "cpu"},
		{"limits", func(s *runc.Spec) { s.MemoryLimit, s.PidsLimit, s.CPUMillis = 1<<30, 4096, 10 }, ""},
		{"relative mount", func(s *runc.Spec) { s.Mounts = []specs.Mount{{Destination: "data"}} }, "mount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.change(&s)
			err := s.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error about %s", err, tt.want)
			}
			if err := runc.WriteBundle(t.TempDir(), s); err == nil {
				t.Error("WriteBundle accepted an invalid spec")
			}
		})
	}
}

func TestDefaultSeccomp(t *testing.T) {
	sc, err := runc.DefaultSeccomp(runc.Spec{Rootfs: "/r", Args: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if sc == nil || sc.DefaultAction != specs.ActErrno {
		t.Fatalf("default action %v, want errno for unlisted calls", sc)
	}
	allowed := map[string]bool{}
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && len(r.Args) == 0 {
			for _, n := range r.Names {
				allowed[n] = true
			}
		}
	}
	for _, n := range []string{"read", "write", "epoll_wait", "setsockopt", "mmap"} {
		if !allowed[n] {
			t.Errorf("%s not allowed", n)
		}
	}
	for _, n := range []string{"kexec_load", "init_module", "open_by_handle_at"} {
		if allowed[n] {
			t.Errorf("%s allowed, the default profile refuses it", n)
		}
	}
	cfg, err := runc.Spec{Rootfs: "/r", Args: []string{"sh"}, Seccomp: sc}.Config()
	if err != nil || cfg.Linux.Seccomp != sc {
		t.Fatalf("config does not carry the profile: %v", err)
	}
}

// TestDefaultCapabilities: without a user namespace the container's root
// is the host's, so the default set leaves out CAP_MKNOD (a block device
// node in the writable layer, which is on the host's file system) and
// CAP_NET_RAW (forged frames on the node's bridge).
func TestDefaultCapabilities(t *testing.T) {
	cfg, err := runc.Spec{Rootfs: "/r", Args: []string{"sh"}}.Config()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Process.Capabilities
	for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted} {
		for _, no := range []string{"CAP_MKNOD", "CAP_NET_RAW", "CAP_SYS_ADMIN"} {
			if slices.Contains(set, no) {
				t.Errorf("default set %v has %s", set, no)
			}
		}
		if !slices.Contains(set, "CAP_NET_BIND_SERVICE") || !slices.Contains(set, "CAP_SETUID") {
			t.Errorf("default set %v lacks what services dropping privileges need", set)
		}
	}
	for _, c := range runc.DefaultCapabilities {
		if !slices.Contains(runc.KnownCapabilities, c) {
			t.Errorf("default capability %s is not a known one", c)
		}
	}
}

// TestWithCapabilities: --cap-add names, in any case and with or without
// CAP_, are added once to the defaults; an unknown name is refused, and
// so is a spec carrying one.
func TestWithCapabilities(t *testing.T) {
	caps, err := runc.WithCapabilities([]string{"NET_RAW", "cap_mknod", "CAP_NET_RAW", "CAP_CHOWN"})
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(runc.DefaultCapabilities), "CAP_NET_RAW", "CAP_MKNOD")
	if !slices.Equal(caps, want) {
		t.Errorf("caps %v, want %v", caps, want)
	}
	cfg, err := runc.Spec{Rootfs: "/r", Args: []string{"sh"}, Capabilities: caps}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Process.Capabilities; !slices.Equal(got.Bounding, want) || !slices.Equal(got.Effective, want) || !slices.Equal(got.Permitted, want) {
		t.Errorf("config capabilities %+v, want %v", got, want)
	}
	for _, bad := range []string{"CAP_NET_RAWX", "FLY", "", "CAP_"} {
		if _, err := runc.WithCapabilities([]string{bad}); !errors.Is(err, runc.ErrUnknownCapability) {
			t.Errorf("WithCapabilities(%q): %v, want ErrUnknownCapability", bad, err)
		}
	}
	if _, err := (runc.Spec{Rootfs: "/r", Args: []string{"sh"}, Capabilities: []string{"CAP_FLY"}}).Config(); !errors.Is(err, runc.ErrUnknownCapability) {
		t.Errorf("spec with CAP_FLY: %v, want ErrUnknownCapability", err)
	}
}
