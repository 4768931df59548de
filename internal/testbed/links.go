package testbed

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/linkemu"
	"github.com/edgehop/edgehop/internal/linux"
)

// queues returns the NFQUEUE numbers of a member's link: up carries packets
// from the member into the core, down carries packets to it.
func (st *State) queues(m Member, kind memberKind) (up, down uint16) {
	i := m.Index
	switch kind {
	case clientMember:
		i += len(st.Nodes)
	case apMember:
		i += len(st.Nodes) + len(st.Clients)
	}
	return uint16(2 * i), uint16(2*i + 1)
}

type memberKind int

const (
	nodeMember memberKind = iota
	clientMember
	apMember
)

func (st *State) linkdSocket() string { return filepath.Join(st.Dir, "core", "linkd.sock") }

func linkParams(l Link) linkemu.Params {
	return linkemu.Params{Delay: l.Delay, Jitter: l.Jitter, Loss: l.Loss}
}

// setupLinks installs the NFQUEUE rules and tbf shaping of every link and
// returns the delay daemon to run inside the core.
func setupLinks(st *State, o Options) (Proc, error) {
	args := []string{"linkd", "--control", st.linkdSocket()}
	type link struct {
		m    Member
		kind memberKind
	}
	var links []link
	for _, m := range st.Nodes {
		links = append(links, link{m, nodeMember})
	}
	for _, m := range st.Clients {
		links = append(links, link{m, clientMember})
	}
	for _, m := range st.APs {
		links = append(links, link{m, apMember})
	}
	for _, l := range links {
		up, down := st.queues(l.m, l.kind)
		var err error
		if l.kind == clientMember && len(st.APs) > 0 {
			// Matched by the client's addresses: the queues stay when
			// its virtual AP moves.
			err = linkemu.InstallPrefix(st.Core.NetNSPath, ClientPrefix(l.m.Index).String(), up, down)
		} else {
			err = linkemu.InstallLink(st.Core.NetNSPath, l.m.Name, up, down)
		}
		if err != nil {
			return Proc{}, fmt.Errorf("%s: %w", l.m.Name, err)
		}
		if err := st.shape(l.m, l.kind, l.m.Link.RateBps); err != nil {
			return Proc{}, fmt.Errorf("%s: %w", l.m.Name, err)
		}
		for _, q := range []uint16{up, down} {
			args = append(args, "--queue", fmt.Sprintf("%d:%d:%d:%s", q, l.m.Link.Delay.Microseconds(), l.m.Link.Jitter.Microseconds(),
				strconv.FormatFloat(l.m.Link.Loss, 'f', -1, 64)))
		}
	}
	st.LinkdSock = st.linkdSocket()
	coreDir := filepath.Join(st.Dir, "core")
	return Proc{Name: "linkd", NetNS: st.Core.NetNSPath, Args: append([]string{o.Binary}, args...),
		Log: filepath.Join(coreDir, "linkd.log"), PIDFile: filepath.Join(coreDir, "linkd.pid")}, nil
}

// waitLinkd waits until the delay daemon answers on its control socket.
func waitLinkd(ctx context.Context, st *State) error {
	coreDir := filepath.Join(st.Dir, "core")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := linkemu.Status(ctx, st.LinkdSock); err == nil {
			return nil
		} else if time.Now().After(deadline) || exited(filepath.Join(coreDir, "linkd.pid")) {
			log := filepath.Join(coreDir, "linkd.log")
			return fmt.Errorf("linkd not ready (%s ends: %q): %w", log, logTail(log, 400), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shape sets the rate of both directions of m's link.
func (st *State) shape(m Member, kind memberKind, rate uint64) error {
	nearNS, nearIf, farIf := st.Core.NetNSPath, m.Name, FarIfName
	switch {
	case kind == apMember:
		farIf = apUplink
	case kind == clientMember && m.AP != "":
		ap, ok := st.APIndex(m.AP)
		if !ok {
			return fmt.Errorf("client %s on unknown access point %q", m.Name, m.AP)
		}
		nearNS, nearIf = st.APs[ap].NetNSPath, vapName(m.Index)
	}
	nh, err := linux.Handle(nearNS)
	if err != nil {
		return err
	}
	defer nh.Close()
	if err := linkemu.Shape(nh, nearIf, rate); err != nil {
		return fmt.Errorf("shape %s: %w", nearIf, err)
	}
	fh, err := linux.Handle(m.NetNSPath)
	if err != nil {
		return err
	}
	defer fh.Close()
	if err := linkemu.Shape(fh, farIf, rate); err != nil {
		return fmt.Errorf("shape far side: %w", err)
	}
	return nil
}

// SetLink changes a member's link parameters while the testbed runs.
func SetLink(ctx context.Context, root, name, member string, l Link) error {
	if err := l.Validate(); err != nil {
		return err
	}
	return withLock(Dir(root, name), func() error { return setLinkLocked(ctx, root, name, member, l) })
}

func setLinkLocked(ctx context.Context, root, name, member string, l Link) error {
	st, err := Load(root, name)
	if err != nil {
		return err
	}
	kind := nodeMember
	idx := -1
	for i, m := range st.Nodes {
		if m.Name == member {
			idx = i
		}
	}
	for i, m := range st.Clients {
		if m.Name == member {
			idx, kind = i, clientMember
		}
	}
	for i, m := range st.APs {
		if m.Name == member {
			idx, kind = i, apMember
		}
	}
	if idx < 0 {
		return fmt.Errorf("unknown node, client or access point %q (see 'edgehop testbed status')", member)
	}
	m := st.Nodes
	switch kind {
	case clientMember:
		m = st.Clients
	case apMember:
		m = st.APs
	}
	if m[idx].Link.RateBps != l.RateBps {
		if err := st.shape(m[idx], kind, l.RateBps); err != nil {
			return err
		}
	}
	up, down := st.queues(m[idx], kind)
	for _, q := range []uint16{up, down} {
		if err := linkemu.SetParams(ctx, st.LinkdSock, q, linkParams(l)); err != nil {
			return fmt.Errorf("set delay: %w", err)
		}
	}
	m[idx].Link = l
	return st.save()
}

// logTail is the last n bytes of the file at path, for error messages.
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}
