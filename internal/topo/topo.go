package topo

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
)

// Point is a position on the plane, in metres.
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// Dist is the Euclidean distance between p and q in metres.
func Dist(p, q Point) float64 { return math.Hypot(p.X-q.X, p.Y-q.Y) }

// Region groups access points and the edge nodes that serve them (ARNAB
// Sec. 4.3: a regional access change can trigger a migration).
type Region struct {
	Name string `json:"name"`
}

// AP is a physical access point.
type AP struct {
	Name   string `json:"name"`
	Region string `json:"region"`
	Pos    Point  `json:"pos"`
}

// Node is an edge node that runs services.
type Node struct {
	Name   string `json:"name"`
	Region string `json:"region"`
	Pos    Point  `json:"pos"`
}

// Link joins two regions at the aggregation layer.
type Link struct {
	A        string  `json:"a"`
	B        string  `json:"b"`
	DelayMs  float64 `json:"delay_ms"`
	RateMbps float64 `json:"rate_mbps"`
}

// Topology is a whole deployment.
type Topology struct {
	Regions []Region `json:"regions"`
	APs     []AP     `json:"aps"`
	Nodes   []Node   `json:"nodes"`
	Links   []Link   `json:"links"`
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// Validate reports every problem: names, unknown regions, duplicates,
// positions that are not numbers.
func (t Topology) Validate() error {
	var errs []error
	regions := map[string]bool{}
	for _, r := range t.Regions {
		if !nameRE.MatchString(r.Name) {
			errs = append(errs, fmt.Errorf("region name %q", r.Name))
		}
		if regions[r.Name] {
			errs = append(errs, fmt.Errorf("region %q twice", r.Name))
		}
		regions[r.Name] = true
	}
	seen := map[string]string{}
	check := func(kind, name, region string, p Point) {
		if !nameRE.MatchString(name) {
			errs = append(errs, fmt.Errorf("%s name %q", kind, name))
		}
		if k, dup := seen[name]; dup {
			errs = append(errs, fmt.Errorf("%s %q has the name of a %s", kind, name, k))
		}
		seen[name] = kind
		if !regions[region] {
			errs = append(errs, fmt.Errorf("%s %q: unknown region %q", kind, name, region))
		}
		if math.IsNaN(p.X) || math.IsNaN(p.Y) || math.IsInf(p.X, 0) || math.IsInf(p.Y, 0) {
			errs = append(errs, fmt.Errorf("%s %q: position %v", kind, name, p))
		}
	}
	for _, a := range t.APs {
		check("access point", a.Name, a.Region, a.Pos)
	}
	for _, n := range t.Nodes {
		check("node", n.Name, n.Region, n.Pos)
	}
	for _, l := range t.Links {
		if !regions[l.A] || !regions[l.B] || l.A == l.B {
			errs = append(errs, fmt.Errorf("link %s-%s: want two different known regions", l.A, l.B))
		}
		if l.DelayMs < 0 || l.RateMbps < 0 {
			errs = append(errs, fmt.Errorf("link %s-%s: negative delay or rate", l.A, l.B))
		}
	}
	return errors.Join(errs...)
}

// AP returns the access point called name.
func (t Topology) AP(name string) (AP, bool) {
	for _, a := range t.APs {
		if a.Name == name {
			return a, true
		}
	}
	return AP{}, false
}

// Node returns the node called name.
func (t Topology) Node(name string) (Node, bool) {
	for _, n := range t.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Node{}, false
}

// NearestAP is the access point closest to p ("" when there is none).
func (t Topology) NearestAP(p Point) string {
	best, bd := "", math.Inf(1)
	for _, a := range t.APs {
		if d := Dist(a.Pos, p); d < bd {
			best, bd = a.Name, d
		}
	}
	return best
}

// NodesByDistance lists the nodes from the closest to p to the farthest
// (ties by name).
func (t Topology) NodesByDistance(p Point) []Node {
	out := append([]Node(nil), t.Nodes...)
	sort.SliceStable(out, func(i, j int) bool {
		di, dj := Dist(out[i].Pos, p), Dist(out[j].Pos, p)
		if di != dj {
			return di < dj
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// RegionHops is the number of aggregation links between regions a and b
// (0 for the same region, -1 when they are not connected).
func (t Topology) RegionHops(a, b string) int {
	if a == b {
		return 0
	}
	adj := map[string][]string{}
	for _, l := range t.Links {
		adj[l.A] = append(adj[l.A], l.B)
		adj[l.B] = append(adj[l.B], l.A)
	}
	dist := map[string]int{a: 0}
	queue := []string{a}
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		for _, n := range adj[r] {
			if _, ok := dist[n]; !ok {
				dist[n] = dist[r] + 1
				if n == b {
					return dist[n]
				}
				queue = append(queue, n)
			}
		}
	}
	return -1
}

// Line is the demo's deployment: regions side by side along a road, each
// width metres wide with apsPerRegion access points spread along it and
// one edge node at its middle, set back 50 m; consecutive regions are
// linked.
func Line(regions, apsPerRegion int, width float64) Topology {
	var t Topology
	for r := 0; r < regions; r++ {
		name := fmt.Sprintf("region%d", r)
		t.Regions = append(t.Regions, Region{Name: name})
		x0 := float64(r) * width
		for a := 0; a < apsPerRegion; a++ {
			x := x0 + width*(float64(a)+0.5)/float64(apsPerRegion)
			t.APs = append(t.APs, AP{Name: fmt.Sprintf("ap%d", r*apsPerRegion+a), Region: name, Pos: Point{X: x}})
		}
		t.Nodes = append(t.Nodes, Node{Name: fmt.Sprintf("node%d", r), Region: name, Pos: Point{X: x0 + width/2, Y: 50}})
		if r > 0 {
			t.Links = append(t.Links, Link{A: fmt.Sprintf("region%d", r-1), B: name, DelayMs: 2, RateMbps: 1000})
		}
	}
	return t
}

// Index answers a topology's questions quickly: by name, by region,
// hops between regions, what is near a point (a dense grid over the
// topology's bounding box). Build it once with NewIndex; it is read-only
// afterwards and safe for concurrent use.
type Index struct {
	T       Topology
	aps     map[string]AP
	nodes   map[string]Node
	byRegin map[string][]Node
	hops    map[[2]string]int
	grid    grid
}

// grid files access points and nodes by cell of a dense array.
type grid struct {
	min        Point
	cell       float64
	cols, rows int
	aps        [][]AP
	nodes      [][]Node
}

const gridCell = 500.0 // metres

func (g *grid) at(p Point) (int, int) {
	c := int(math.Floor((p.X - g.min.X) / g.cell))
	r := int(math.Floor((p.Y - g.min.Y) / g.cell))
	return min(max(c, 0), g.cols-1), min(max(r, 0), g.rows-1)
}

func (g *grid) span(p Point, r float64) (c0, r0, c1, r1 int) {
	c0, r0 = g.at(Point{p.X - r, p.Y - r})
	c1, r1 = g.at(Point{p.X + r, p.Y + r})
	return
}

// APsNear appends to buf the access points within r metres of p
// (unordered) and returns it.
func (x *Index) APsNear(buf []AP, p Point, r float64) []AP {
	c0, r0, c1, r1 := x.grid.span(p, r)
	r2 := r * r
	for j := r0; j <= r1; j++ {
		for i := c0; i <= c1; i++ {
			for _, a := range x.grid.aps[j*x.grid.cols+i] {
				if dx, dy := a.Pos.X-p.X, a.Pos.Y-p.Y; dx*dx+dy*dy <= r2 {
					buf = append(buf, a)
				}
			}
		}
	}
	return buf
}

// NodesNear appends to buf the nodes within r metres of p (unordered)
// and returns it.
func (x *Index) NodesNear(buf []Node, p Point, r float64) []Node {
	c0, r0, c1, r1 := x.grid.span(p, r)
	r2 := r * r
	for j := r0; j <= r1; j++ {
		for i := c0; i <= c1; i++ {
			for _, n := range x.grid.nodes[j*x.grid.cols+i] {
				if dx, dy := n.Pos.X-p.X, n.Pos.Y-p.Y; dx*dx+dy*dy <= r2 {
					buf = append(buf, n)
				}
			}
		}
	}
	return buf
}

// NewIndex indexes t.
func NewIndex(t Topology) *Index {
	x := &Index{T: t, aps: map[string]AP{}, nodes: map[string]Node{}, byRegin: map[string][]Node{}, hops: map[[2]string]int{}}
	lo, hi := Point{X: math.Inf(1), Y: math.Inf(1)}, Point{X: math.Inf(-1), Y: math.Inf(-1)}
	grow := func(p Point) {
		lo.X, lo.Y, hi.X, hi.Y = math.Min(lo.X, p.X), math.Min(lo.Y, p.Y), math.Max(hi.X, p.X), math.Max(hi.Y, p.Y)
	}
	for _, a := range t.APs {
		x.aps[a.Name] = a
		grow(a.Pos)
	}
	for _, n := range t.Nodes {
		x.nodes[n.Name] = n
		x.byRegin[n.Region] = append(x.byRegin[n.Region], n)
		grow(n.Pos)
	}
	if math.IsInf(lo.X, 0) {
		lo, hi = Point{}, Point{}
	}
	// A million cells at most, however spread out the topology is.
	cell := math.Max(gridCell, math.Sqrt((hi.X-lo.X+1)*(hi.Y-lo.Y+1)/1e6))
	g := grid{min: lo, cell: cell, cols: int((hi.X-lo.X)/cell) + 1, rows: int((hi.Y-lo.Y)/cell) + 1}
	g.aps, g.nodes = make([][]AP, g.cols*g.rows), make([][]Node, g.cols*g.rows)
	for _, a := range t.APs {
		c, r := g.at(a.Pos)
		g.aps[r*g.cols+c] = append(g.aps[r*g.cols+c], a)
	}
	for _, n := range t.Nodes {
		c, r := g.at(n.Pos)
		g.nodes[r*g.cols+c] = append(g.nodes[r*g.cols+c], n)
	}
	x.grid = g
	if len(t.Regions) <= 200 {
		for _, a := range t.Regions {
			for _, b := range t.Regions {
				x.hops[[2]string{a.Name, b.Name}] = t.RegionHops(a.Name, b.Name)
			}
		}
	}
	return x
}

// AP returns the access point called name.
func (x *Index) AP(name string) (AP, bool) { a, ok := x.aps[name]; return a, ok }

// Node returns the node called name.
func (x *Index) Node(name string) (Node, bool) { n, ok := x.nodes[name]; return n, ok }

// RegionNodes lists the nodes of a region, in topology order.
func (x *Index) RegionNodes(region string) []Node { return x.byRegin[region] }

// RegionHops is Topology.RegionHops, precomputed (-1 for unknown regions).
func (x *Index) RegionHops(a, b string) int {
	if h, ok := x.hops[[2]string{a, b}]; ok {
		return h
	}
	if a == b {
		return 0
	}
	if len(x.hops) == 0 { // too many regions to precompute
		return x.T.RegionHops(a, b)
	}
	return -1
}
