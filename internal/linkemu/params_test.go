package linkemu

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestParamsValidate(t *testing.T) {
	for _, tc := range []struct {
		p  Params
		ok bool
	}{
		{Params{}, true},
		{Params{Delay: 150 * time.Millisecond, Jitter: 10 * time.Millisecond, Loss: 0.01}, true},
		{Params{Loss: 1}, true},
		{Params{Delay: -1}, false},
		{Params{Jitter: -1}, false},
		{Params{Delay: 2 * time.Minute}, false},
		{Params{Loss: 1.5}, false},
		{Params{Loss: -0.1}, false},
	} {
		if err := tc.p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%v.Validate() = %v, want ok=%v", tc.p, err, tc.ok)
		}
	}
}

// Packets arrive every `gap`; the table checks release times and drops.
func TestPipeAdmit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name string
		p    Params
		gap  time.Duration
		n    int
		// check runs on the results.
		check func(t *testing.T, arrive, release []time.Time, dropped int)
	}{
		{"no delay releases at once", Params{}, time.Millisecond, 100, func(t *testing.T, a, r []time.Time, d int) {
			for i := range r {
				if !r[i].Equal(a[i]) {
					t.Fatalf("packet %d released at +%v, want at arrival", i, r[i].Sub(a[i]))
				}
			}
		}},
		{"fixed delay", Params{Delay: 10 * time.Millisecond}, time.Millisecond, 100, func(t *testing.T, a, r []time.Time, d int) {
			for i := range r {
				if got := r[i].Sub(a[i]); got != 10*time.Millisecond {
					t.Fatalf("packet %d delayed %v, want 10ms", i, got)
				}
			}
		}},
		{"jitter stays within bounds and never reorders", Params{Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}, 100 * time.Microsecond, 5000,
			func(t *testing.T, a, r []time.Time, d int) {
				var sum time.Duration
				for i := range r {
					dl := r[i].Sub(a[i])
					sum += dl
					if dl < 5*time.Millisecond || dl > 15*time.Millisecond+100*time.Microsecond*time.Duration(i+1) {
						t.Fatalf("packet %d delayed %v, outside [5ms, 15ms+]", i, dl)
					}
					if i > 0 && r[i].Before(r[i-1]) {
						t.Fatalf("packet %d released before packet %d", i, i-1)
					}
				}
				// FIFO under jitter makes the mean delay exceed Delay.
				if mean := sum / time.Duration(len(r)); mean < 10*time.Millisecond || mean > 15*time.Millisecond {
					t.Errorf("mean delay %v, want in [10ms, 15ms]", mean)
				}
			}},
		{"sparse jitter keeps its spread", Params{Delay: 10 * time.Millisecond, Jitter: 5 * time.Millisecond}, 100 * time.Millisecond, 2000,
			func(t *testing.T, a, r []time.Time, d int) {
				lo, hi := time.Hour, time.Duration(0)
				for i := range r {
					dl := r[i].Sub(a[i])
					lo, hi = min(lo, dl), max(hi, dl)
				}
				if lo > 5500*time.Microsecond || hi < 14500*time.Microsecond {
					t.Errorf("delays span [%v, %v], want about [5ms, 15ms]", lo, hi)
				}
			}},
		{"loss half", Params{Loss: 0.5}, time.Millisecond, 10000, func(t *testing.T, a, r []time.Time, d int) {
			if d < 4800 || d > 5200 {
				t.Errorf("dropped %d of 10000, want about 5000", d)
			}
		}},
		{"loss all", Params{Loss: 1}, time.Millisecond, 100, func(t *testing.T, a, r []time.Time, d int) {
			if d != 100 {
				t.Errorf("dropped %d of 100, want all", d)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPipe(tc.p, rand.New(rand.NewPCG(1, 2)))
			var arrive, release []time.Time
			dropped := 0
			for i := range tc.n {
				now := t0.Add(time.Duration(i) * tc.gap)
				r, drop := p.admit(now)
				if drop {
					dropped++
					continue
				}
				arrive, release = append(arrive, now), append(release, r)
			}
			tc.check(t, arrive, release, dropped)
		})
	}
}

// Lowering the delay at run time must not let new packets overtake held
// ones.
func TestPipeSetKeepsOrder(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := newPipe(Params{Delay: 50 * time.Millisecond}, rand.New(rand.NewPCG(1, 2)))
	r1, _ := p.admit(t0)
	p.set(Params{})
	r2, _ := p.admit(t0.Add(time.Millisecond))
	if r2.Before(r1) {
		t.Fatalf("after lowering the delay a packet is released at +%v, before the held one at +%v", r2.Sub(t0), r1.Sub(t0))
	}
	r3, _ := p.admit(t0.Add(60 * time.Millisecond))
	if !r3.Equal(t0.Add(60 * time.Millisecond)) {
		t.Errorf("once the held packet is gone, delay 0 releases at arrival; got +%v", r3.Sub(t0))
	}
}

// The same seed gives the same decisions.
func TestPipeDeterministic(t *testing.T) {
	run := func() string {
		p := newPipe(Params{Delay: time.Millisecond, Jitter: time.Millisecond, Loss: 0.3}, rand.New(rand.NewPCG(7, 3)))
		var b strings.Builder
		for i := range 200 {
			r, d := p.admit(time.Unix(0, int64(i)*int64(time.Millisecond)))
			b.WriteString(r.String())
			if d {
				b.WriteString("drop")
			}
		}
		return b.String()
	}
	if run() != run() {
		t.Error("two runs with the same seed differ")
	}
}

func TestParseQueueSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want QueueSpec
		ok   bool
	}{
		{"3", QueueSpec{Queue: 3}, true},
		{"3:10000", QueueSpec{Queue: 3, DelayUS: 10000}, true},
		{"0:10000:2000:0.01", QueueSpec{Queue: 0, DelayUS: 10000, JitterUS: 2000, Loss: 0.01}, true},
		{"65535:0:0:1", QueueSpec{Queue: 65535, Loss: 1}, true},
		{"65536", QueueSpec{}, false},
		{"3:x", QueueSpec{}, false},
		{"3:-5", QueueSpec{}, false},
		{"3:0:0:2", QueueSpec{}, false},
		{"3:99999999999999999", QueueSpec{}, false},
		{"3:0:0:0:0", QueueSpec{}, false},
		{"", QueueSpec{}, false},
	} {
		got, err := ParseQueueSpec(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseQueueSpec(%q) = %+v, %v; want %+v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestParseRules(t *testing.T) {
	out := `-P PREROUTING ACCEPT
-P INPUT ACCEPT
-P FORWARD ACCEPT
-P OUTPUT ACCEPT
-P POSTROUTING ACCEPT
-N EDGEHOP-LINKS-DOWN
-N EDGEHOP-LINKS-UP
-A PREROUTING -j EDGEHOP-LINKS-UP
-A POSTROUTING -j EDGEHOP-LINKS-DOWN
-A EDGEHOP-LINKS-DOWN -o node0 -j NFQUEUE --queue-bypass
-A EDGEHOP-LINKS-DOWN -o client0 -j NFQUEUE --queue-num 5 --queue-bypass
-A EDGEHOP-LINKS-UP -i node0 -j NFQUEUE --queue-num 1 --queue-bypass
-A EDGEHOP-LINKS-UP -i client0 -j NFQUEUE --queue-num 4 --queue-bypass
-A EDGEHOP-LINKS-UP -s 172.31.1.0/24 -j NFQUEUE --queue-num 6 --queue-bypass
-A EDGEHOP-LINKS-DOWN -d 172.31.1.0/24 -j NFQUEUE --queue-num 7 --queue-bypass
`
	st, err := parseRules([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if !st.chainUp || !st.chainDown || !st.jumpUp || !st.jumpDown {
		t.Errorf("chains/jumps not all seen: %+v", st)
	}
	want := []LinkQueues{{Interface: "node0", Up: 1}, {Interface: "client0", Up: 4, Down: 5}, {Prefix: "172.31.1.0/24", Up: 6, Down: 7}}
	if len(st.links) != 3 || st.links[0] != want[0] || st.links[1] != want[1] || st.links[2] != want[2] {
		t.Errorf("links %+v, want %+v", st.links, want)
	}
	// The script writes what parses back.
	back, err := parseRules([]byte(strings.ReplaceAll(strings.ReplaceAll(st.script(st.links), "*mangle\n", ""), "COMMIT\n", "")))
	if err != nil || len(back.links) != 3 || back.links[2] != want[2] {
		t.Errorf("script round trip: %+v, %v", back.links, err)
	}
	if _, err := parseRules([]byte("-A EDGEHOP-LINKS-UP -j ACCEPT\n")); err == nil {
		t.Error("a foreign rule in our chain parsed without error")
	}
	empty, err := parseRules([]byte("-P PREROUTING ACCEPT\n"))
	if err != nil || empty.chainUp || empty.jumpUp || len(empty.links) != 0 {
		t.Errorf("empty table: %+v, %v", empty, err)
	}
}
