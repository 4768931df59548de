package workload

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The line protocol on DPRGen's TCP port (default DefaultPort). Every
// request is one line; every reply is one line:
//
//	check  →  ok <pages> <version-sum>  |  bad <first bad page> <reason>
//	stats  →  stats pages=<P> hot=<H> writes=<W> rate=<pages/s> gaps=<G> seed=<S>
//	ping   →  pong
//
// Anything else is answered with "error <message>".

// DefaultPort is DPRGen's TCP port.
const DefaultPort = 7001

// ErrProtocol reports a reply that does not follow the protocol.
var ErrProtocol = errors.New("dprgen protocol")

// CheckLine is the reply line to a check.
func CheckLine(r CheckResult) string {
	if r.OK() {
		return fmt.Sprintf("ok %d %d", r.Pages, r.VersionSum)
	}
	return fmt.Sprintf("bad %d %s", r.BadPage, r.Reason)
}

// CheckReply is a parsed reply to a check.
type CheckReply struct {
	OK         bool   `json:"ok"`
	Pages      int    `json:"pages"`
	VersionSum uint64 `json:"version_sum"`
	BadPage    int    `json:"bad_page"` // -1 when OK
	Reason     string `json:"reason,omitempty"`
	Line       string `json:"line"`
}

// ParseCheckReply parses the reply line to a check.
func ParseCheckReply(line string) (CheckReply, error) {
	line = strings.TrimSpace(line)
	f := strings.Fields(line)
	bad := fmt.Errorf("%w: check reply %q", ErrProtocol, line)
	switch {
	case len(f) == 3 && f[0] == "ok":
		pages, err1 := strconv.Atoi(f[1])
		sum, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || pages < 1 {
			return CheckReply{}, bad
		}
		return CheckReply{OK: true, Pages: pages, VersionSum: sum, BadPage: -1, Line: line}, nil
	case len(f) >= 2 && f[0] == "bad":
		page, err := strconv.Atoi(f[1])
		if err != nil || page < 0 {
			return CheckReply{}, bad
		}
		return CheckReply{BadPage: page, Reason: strings.Join(f[2:], " "), Line: line}, nil
	}
	return CheckReply{}, bad
}

// StatsLine is the reply line to a stats request.
func StatsLine(s Stats) string {
	return fmt.Sprintf("stats pages=%d hot=%d writes=%d rate=%s gaps=%d seed=%d",
		s.Pages, s.Hot, s.Writes, strconv.FormatFloat(s.Rate, 'g', -1, 64), s.Gaps, s.Seed)
}

// ParseStats parses the reply line to a stats request.
func ParseStats(line string) (Stats, error) {
	line = strings.TrimSpace(line)
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "stats" {
		return Stats{}, fmt.Errorf("%w: stats reply %q", ErrProtocol, line)
	}
	var s Stats
	for _, kv := range f[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return Stats{}, fmt.Errorf("%w: stats field %q", ErrProtocol, kv)
		}
		var err error
		switch k {
		case "pages":
			s.Pages, err = strconv.Atoi(v)
		case "hot":
			s.Hot, err = strconv.Atoi(v)
		case "writes":
			s.Writes, err = strconv.ParseUint(v, 10, 64)
		case "rate":
			s.Rate, err = strconv.ParseFloat(v, 64)
		case "gaps":
			s.Gaps, err = strconv.Atoi(v)
		case "seed":
			s.Seed, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return Stats{}, fmt.Errorf("%w: stats field %q: %v", ErrProtocol, kv, err)
		}
	}
	return s, nil
}
