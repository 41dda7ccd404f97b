package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redlimit/redlimit/internal/hashslot"
)

// NumSlots is the number of hash slots of a Redis Cluster.
const NumSlots = hashslot.Count

// clusterStartTimeout bounds StartCluster.
const clusterStartTimeout = 30 * time.Second

// Cluster is a Redis Cluster of redis-server child processes on loopback.
//
// Masters and Replicas describe the layout when the cluster was created;
// after a failover ask [Cluster.MasterOf] and [Cluster.ReplicaOf] for the
// current roles. Nodes can be killed, paused and restarted with the
// [Server] methods; a restarted node keeps its node id (nodes.conf is in
// its Dir) and rejoins the cluster.
type Cluster struct {
	// Masters are the masters at creation, in slot order: Masters[0]
	// served slot 0.
	Masters []*Server
	// Replicas are the replicas at creation, grouped by master:
	// Replicas[i] replicated Masters[i/ReplicasPerMaster].
	Replicas []*Server
	// ReplicasPerMaster is the replicasPerMaster given to StartCluster.
	ReplicasPerMaster int

	closeOnce sync.Once
}

// StartCluster starts masters masters (1, or at least 3) and replicasPerMaster
// replicas for each, with --cluster-enabled yes --cluster-node-timeout 2000
// --repl-diskless-sync-delay 0 and persistence off, followed by args on
// every node (for example "--cluster-require-full-coverage", "no"). It
// creates the cluster with `redis-cli --cluster create` and waits (up to 30 s
// in all) until every node reports cluster_state:ok, sees all 16384 slots
// served by the expected masters with their replicas (CLUSTER SLOTS and
// CLUSTER NODES, no node flagged as failing), and every replica's link to its
// master is up. On this machine that takes 2-4 s.
//
// The caller must Close the cluster. The error wraps [ErrNotInstalled] when
// redis-server or redis-cli is not on the PATH.
func StartCluster(masters, replicasPerMaster int, args ...string) (*Cluster, error) {
	if _, err := serverPath(); err != nil {
		return nil, err
	}
	redisCLI, err := cliPath()
	if err != nil {
		return nil, err
	}
	if masters == 1 && replicasPerMaster == 0 {
		return startSingleNodeCluster(args)
	}
	if masters < 3 || replicasPerMaster < 0 {
		return nil, fmt.Errorf("redistest: cluster of %d masters with %d replicas each: need 1 master alone, or at least 3", masters, replicasPerMaster)
	}
	deadline := time.Now().Add(clusterStartTimeout)
	nodeArgs := append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
		"--repl-diskless-sync-delay", "0",
	}, args...)

	nodes, err := startNodes(masters*(1+replicasPerMaster), nodeArgs)
	c := &Cluster{ReplicasPerMaster: replicasPerMaster}
	fail := func(err error) (*Cluster, error) {
		c.Masters = nil
		for _, s := range nodes {
			if s != nil {
				c.Masters = append(c.Masters, s)
			}
		}
		c.Replicas = nil
		c.Close()
		return nil, err
	}
	if err != nil {
		return fail(err)
	}
	if err := createCluster(redisCLI, nodes, replicasPerMaster, deadline); err != nil {
		return fail(err)
	}
	view, err := waitCreated(nodes, masters, replicasPerMaster, deadline)
	if err != nil {
		return fail(err)
	}
	if c.Masters, c.Replicas, err = byRole(nodes, view); err != nil {
		return fail(err)
	}
	return c, nil
}

// startNodes starts n servers with args, at once, and returns them (nil
// where one failed to start) and their errors.
func startNodes(n int, args []string) ([]*Server, error) {
	nodes := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() { nodes[i], errs[i] = startServer(true, args) })
	}
	wg.Wait()
	return nodes, errors.Join(errs...)
}

// createCluster makes a cluster of nodes, with replicasPerMaster replicas
// per master, with redis-cli --cluster create, by deadline.
func createCluster(redisCLI string, nodes []*Server, replicasPerMaster int, deadline time.Time) error {
	cli := []string{"--cluster", "create"}
	for _, s := range nodes {
		cli = append(cli, s.Addr)
	}
	cli = append(cli, "--cluster-replicas", strconv.Itoa(replicasPerMaster), "--cluster-yes")
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out, err := exec.CommandContext(ctx, redisCLI, cli...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redistest: redis-cli %s: %w\n%s", strings.Join(cli, " "), err, lastLines(string(out), 20))
	}
	return nil
}

// waitCreated waits until every node of a new cluster sees its full layout
// (checkCreated), by deadline, and returns the first node's view.
func waitCreated(nodes []*Server, masters, replicasPerMaster int, deadline time.Time) (*nodesView, error) {
	// Redis 7 leaves a replica out of CLUSTER SLOTS while its replication
	// offset is 0, which it stays on an empty cluster until the master's
	// next replication PING (repl-ping-replica-period, 10 s). Once every
	// replica has synced, one FLUSHALL per master (always replicated, and
	// harmless on a new cluster) moves the offsets; the nodes learn them by
	// gossip within about a second.
	bumped := replicasPerMaster == 0
	for {
		if !bumped && replicasSynced(nodes) {
			if err := flushMasters(nodes); err != nil {
				return nil, err
			}
			bumped = true
		}
		view, err := checkCreated(nodes, masters, replicasPerMaster)
		if err == nil {
			return view, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("redistest: cluster not ready after %v: %w", clusterStartTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// byRole returns nodes as view sees them: the masters in the order of
// their slots, and the replicas of each master in turn, by address.
func byRole(nodes []*Server, view *nodesView) (masters, replicas []*Server, err error) {
	byAddr := make(map[string]*Server, len(nodes))
	for _, s := range nodes {
		byAddr[s.Addr] = s
	}
	for _, m := range view.mastersBySlot() {
		masters = append(masters, byAddr[m.addr])
		reps := view.replicasOf(m.id)
		sort.Slice(reps, func(i, j int) bool { return reps[i].addr < reps[j].addr })
		for _, r := range reps {
			replicas = append(replicas, byAddr[r.addr])
		}
	}
	if slices.Contains(masters, nil) || slices.Contains(replicas, nil) || len(masters)+len(replicas) != len(nodes) {
		return nil, nil, fmt.Errorf("redistest: CLUSTER NODES does not match the started nodes:\n%v", view)
	}
	return masters, replicas, nil
}

// startSingleNodeCluster makes a cluster of one master that serves every
// slot (redis-cli --cluster create wants at least 3 masters), for comparing
// 1 master with more under the same load.
func startSingleNodeCluster(args []string) (*Cluster, error) {
	nodeArgs := append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
		// Alone, a node never learns its own address from a peer.
		"--cluster-announce-ip", "127.0.0.1",
	}, args...)
	s, err := startServer(true, nodeArgs)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Masters: []*Server{s}}
	// CLUSTER ADDSLOTS with every slot: ADDSLOTSRANGE needs Redis 7.
	cmd := []string{"CLUSTER", "ADDSLOTS"}
	for slot := range NumSlots {
		cmd = append(cmd, strconv.Itoa(slot))
	}
	if out, err := do(s.Addr, 2*time.Second, cmd...); err != nil || out != "OK" {
		c.Close()
		return nil, fmt.Errorf("redistest: CLUSTER ADDSLOTS: %q, %v", out, err)
	}
	if err := c.WaitHealthy(clusterStartTimeout); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkCreated returns the first node's view when every node sees the full
// layout: state ok, all slots covered by masters masters each with replicas
// replicas, no failing node, and every replica's link up.
func checkCreated(nodes []*Server, masters, replicas int) (*nodesView, error) {
	var first *nodesView
	for _, s := range nodes {
		if err := checkStateOK(s); err != nil {
			return nil, err
		}
		if err := checkSlotsServed(s, replicas); err != nil {
			return nil, err
		}
		v, err := clusterNodes(s.Addr)
		if err != nil {
			return nil, err
		}
		nm, nr := 0, 0
		for _, e := range v.entries {
			if e.failing() {
				return nil, fmt.Errorf("%s: CLUSTER NODES: %s is %s", s.Addr, e.addr, strings.Join(e.flags, ","))
			}
			switch {
			case e.has("master") && len(e.slots) > 0:
				nm++
			case e.has("slave"):
				nr++
			}
		}
		if nm != masters || nr != masters*replicas {
			return nil, fmt.Errorf("%s: CLUSTER NODES: %d masters with slots and %d replicas, want %d and %d", s.Addr, nm, nr, masters, masters*replicas)
		}
		if me := v.myself(); me != nil && me.has("slave") {
			info, err := doString(s.Addr, "INFO", "replication")
			if err != nil {
				return nil, fmt.Errorf("%s: INFO: %w", s.Addr, err)
			}
			if !strings.Contains(info, "master_link_status:up") {
				return nil, fmt.Errorf("%s: replica link not up", s.Addr)
			}
		}
		if first == nil {
			first = v
		}
	}
	return first, nil
}

// checkSlotsServed checks that s's CLUSTER SLOTS covers every slot, each
// served by a master with replicas replicas.
func checkSlotsServed(s *Server, replicas int) error {
	slots, err := clusterSlots(s.Addr)
	if err != nil {
		return fmt.Errorf("%s: CLUSTER SLOTS: %w", s.Addr, err)
	}
	covered := 0
	for _, r := range slots {
		covered += r.end - r.start + 1
		if len(r.nodes) != 1+replicas {
			return fmt.Errorf("%s: CLUSTER SLOTS: slots %d-%d served by %d nodes, want %d", s.Addr, r.start, r.end, len(r.nodes), 1+replicas)
		}
	}
	if covered != NumSlots {
		return fmt.Errorf("%s: CLUSTER SLOTS: %d slots covered", s.Addr, covered)
	}
	return nil
}

// replicasSynced reports whether every replica (by its own INFO) has its
// link to its master up.
func replicasSynced(nodes []*Server) bool {
	for _, s := range nodes {
		info, err := doString(s.Addr, "INFO", "replication")
		if err != nil {
			return false
		}
		if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
			return false
		}
	}
	return true
}

// flushMasters sends FLUSHALL to every node that is a master.
func flushMasters(nodes []*Server) error {
	for _, s := range nodes {
		info, err := doString(s.Addr, "INFO", "replication")
		if err != nil {
			return fmt.Errorf("redistest: %s: INFO: %w", s.Addr, err)
		}
		if !strings.Contains(info, "role:master") {
			continue
		}
		if _, err := do(s.Addr, 500*time.Millisecond, "FLUSHALL"); err != nil {
			return fmt.Errorf("redistest: %s: FLUSHALL: %w", s.Addr, err)
		}
	}
	return nil
}

// checkStateOK reports an error unless CLUSTER INFO says cluster_state:ok.
func checkStateOK(s *Server) error {
	info, err := doString(s.Addr, "CLUSTER", "INFO")
	if err != nil {
		return fmt.Errorf("%s: CLUSTER INFO: %w", s.Addr, err)
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return fmt.Errorf("%s: cluster_state is not ok", s.Addr)
	}
	return nil
}

// Close stops every node and removes their directories. It may be called
// more than once.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		var wg sync.WaitGroup
		for _, s := range c.nodes() {
			wg.Go(func() { _ = s.Close() }) // one that ignored SIGTERM was killed all the same
		}
		wg.Wait()
	})
}

// nodes returns the masters and then the replicas.
func (c *Cluster) nodes() []*Server {
	return slices.Concat(c.Masters, c.Replicas)
}

// Addrs returns the address of every node, masters first, as seeds for a
// go-redis ClusterClient.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.nodes() {
		a = append(a, s.Addr)
	}
	return a
}

// server returns the node listening on addr, or nil.
func (c *Cluster) server(addr string) *Server {
	for _, s := range c.nodes() {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// MasterOf returns the node that serves slot now, according to CLUSTER SLOTS
// of the first live (running and not paused) node that answers. Views can
// differ for a moment after a failover; call [Cluster.WaitHealthy] first.
func (c *Cluster) MasterOf(slot int) (*Server, error) {
	if slot < 0 || slot >= NumSlots {
		return nil, fmt.Errorf("redistest: slot %d out of range", slot)
	}
	lastErr := errors.New("no live node")
	for _, s := range c.nodes() {
		if !s.live() {
			continue
		}
		slots, err := clusterSlots(s.Addr)
		if err != nil {
			lastErr = err
			continue
		}
		for _, r := range slots {
			if r.start <= slot && slot <= r.end && len(r.nodes) > 0 {
				if m := c.server(r.nodes[0]); m != nil {
					return m, nil
				}
				return nil, fmt.Errorf("redistest: slot %d served by %s, not a node of this cluster", slot, r.nodes[0])
			}
		}
		return nil, fmt.Errorf("redistest: slot %d not served in the view of %s", slot, s.Addr)
	}
	return nil, fmt.Errorf("redistest: master of slot %d: %w", slot, lastErr)
}

// ReplicaOf returns a live node that currently replicates master, according
// to the replica's own INFO replication (role:slave, master_port), preferring
// one whose link to the master is up.
func (c *Cluster) ReplicaOf(master *Server) (*Server, error) {
	var down *Server
	for _, s := range c.nodes() {
		if s == master || !s.live() {
			continue
		}
		info, err := doString(s.Addr, "INFO", "replication")
		if err != nil {
			continue
		}
		if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_port:"+strconv.Itoa(master.Port)+"\r\n") {
			continue
		}
		if strings.Contains(info, "master_link_status:up") {
			return s, nil
		}
		if down == nil {
			down = s
		}
	}
	if down != nil {
		return down, nil
	}
	return nil, fmt.Errorf("redistest: no live replica of %s", master.Addr)
}

// WaitHealthy waits until every live node (running and not paused) reports
// cluster_state:ok and sees all 16384 slots served by live masters, for
// example after a failover or a restart. It returns the last problem seen
// when timeout passes.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster not healthy after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *Cluster) healthy() error {
	live := 0
	for _, s := range c.nodes() {
		if !s.live() {
			continue
		}
		live++
		if err := checkStateOK(s); err != nil {
			return err
		}
		slots, err := clusterSlots(s.Addr)
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SLOTS: %w", s.Addr, err)
		}
		covered := 0
		for _, r := range slots {
			covered += r.end - r.start + 1
			if len(r.nodes) == 0 {
				return fmt.Errorf("%s: slots %d-%d have no node", s.Addr, r.start, r.end)
			}
			if m := c.server(r.nodes[0]); m == nil || !m.live() {
				return fmt.Errorf("%s: slots %d-%d served by %s, which is down", s.Addr, r.start, r.end, r.nodes[0])
			}
		}
		if covered != NumSlots {
			return fmt.Errorf("%s: %d slots covered", s.Addr, covered)
		}
	}
	if live == 0 {
		return errors.New("no live node")
	}
	return nil
}

// slotRange is one CLUSTER SLOTS entry; nodes[0] is the master.
type slotRange struct {
	start, end int
	nodes      []string // "ip:port"
}

func clusterSlots(addr string) ([]slotRange, error) {
	r, err := do(addr, 500*time.Millisecond, "CLUSTER", "SLOTS")
	if err != nil {
		return nil, err
	}
	top, ok := r.([]any)
	if !ok {
		return nil, fmt.Errorf("CLUSTER SLOTS: reply %T", r)
	}
	var out []slotRange
	for _, e := range top {
		a, ok := e.([]any)
		if !ok || len(a) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: bad entry %v", e)
		}
		start, ok1 := a[0].(int64)
		end, ok2 := a[1].(int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("CLUSTER SLOTS: bad range %v", e)
		}
		sr := slotRange{start: int(start), end: int(end)}
		for _, n := range a[2:] {
			na, ok := n.([]any)
			if !ok || len(na) < 2 {
				return nil, fmt.Errorf("CLUSTER SLOTS: bad node %v", n)
			}
			ip, ok1 := na[0].(string)
			port, ok2 := na[1].(int64)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("CLUSTER SLOTS: bad node %v", n)
			}
			sr.nodes = append(sr.nodes, ip+":"+strconv.FormatInt(port, 10))
		}
		out = append(out, sr)
	}
	return out, nil
}

// nodeEntry is one line of CLUSTER NODES.
type nodeEntry struct {
	id, addr, master string
	flags            []string
	slots            []string // "0-5460", "5461", ...; migration entries left out
}

func (e *nodeEntry) has(flag string) bool { return slices.Contains(e.flags, flag) }

func (e *nodeEntry) failing() bool {
	return e.has("fail") || e.has("fail?") || e.has("handshake") || e.has("noaddr")
}

// firstSlot returns the lowest slot of the node, or NumSlots if none.
func (e *nodeEntry) firstSlot() int {
	first := NumSlots
	for _, s := range e.slots {
		lo, _, _ := strings.Cut(s, "-")
		if n, err := strconv.Atoi(lo); err == nil && n < first {
			first = n
		}
	}
	return first
}

type nodesView struct{ entries []*nodeEntry }

func clusterNodes(addr string) (*nodesView, error) {
	text, err := doString(addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, fmt.Errorf("%s: CLUSTER NODES: %w", addr, err)
	}
	return parseNodes(text)
}

func parseNodes(text string) (*nodesView, error) {
	v := &nodesView{}
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES: bad line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		e := &nodeEntry{id: f[0], addr: addr, master: f[3], flags: strings.Split(f[2], ",")}
		for _, s := range f[8:] {
			if !strings.HasPrefix(s, "[") {
				e.slots = append(e.slots, s)
			}
		}
		v.entries = append(v.entries, e)
	}
	return v, nil
}

func (v *nodesView) myself() *nodeEntry {
	for _, e := range v.entries {
		if e.has("myself") {
			return e
		}
	}
	return nil
}

// mastersBySlot returns the masters that serve slots, ordered by first slot.
func (v *nodesView) mastersBySlot() []*nodeEntry {
	var ms []*nodeEntry
	for _, e := range v.entries {
		if e.has("master") && len(e.slots) > 0 {
			ms = append(ms, e)
		}
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].firstSlot() < ms[j].firstSlot() })
	return ms
}

func (v *nodesView) replicasOf(id string) []*nodeEntry {
	var rs []*nodeEntry
	for _, e := range v.entries {
		if e.has("slave") && e.master == id {
			rs = append(rs, e)
		}
	}
	return rs
}

// Slot returns the Redis Cluster hash slot of key, computed locally: CRC16
// (XMODEM) of the key modulo 16384, or of the hash tag when the key has one
// (see [hashslot.Of]).
func Slot(key string) int { return hashslot.Of(key) }

func (v *nodesView) String() string {
	var b strings.Builder
	for _, e := range v.entries {
		fmt.Fprintf(&b, "%s %s %s %s %v\n", e.id, e.addr, strings.Join(e.flags, ","), e.master, e.slots)
	}
	return b.String()
}
