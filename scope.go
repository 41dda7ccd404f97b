package redlimit

import (
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/hashslot"
)

// The scope of down-state. A limiter marks down one Redis node at a time,
// never Redis as a whole: the node that serves the failing key, as the
// client routes it. For a *redis.Client (a FailoverClient too) that is its
// one server; for a *redis.ClusterClient, the master of the key's slot (by
// address, so every slot of a dead master falls back together, and a slot
// that fails over comes back when the client routes it to the new master);
// for a *redis.Ring, the shard of the key. An *redis.AutoPipeliner does not
// tell where a key goes, so it is one scope, like any other client type.
//
// A node is probed with a short key of the failing key's slot, never with
// the caller's key, so that a huge or odd key cannot make probes fail.

// numSlots is the number of hash slots of a Redis Cluster.
const numSlots = hashslot.Count

// scope is one Redis node as the limiter sees it: what is marked down, and
// how it is probed.
type scope struct {
	id    string         // the node's address; "" for the whole client
	probe redis.Scripter // where its probes go
	key   string         // the probe key
}

// scopeOf returns the scope of the state key state: the node the client
// sends it to now. It does not touch the network.
func (r *rescue) scopeOf(state string) scope {
	key := r.e.cfg.prefix + ":{" + probeTag(hashslot.Of(state)) + "}" + probeSuffix
	switch c := r.e.rdb.(type) {
	case *redis.ClusterClient:
		// Probes go through the cluster client, so that they follow the
		// slot when it moves to another master.
		return scope{id: clusterNode(c, state), probe: c, key: key}
	case *redis.Ring:
		// Probes go to the shard itself: through the ring, a probe key
		// could land on another, healthy shard.
		if shard, err := c.GetShardClientForKey(state); err == nil {
			return scope{id: shard.Options().Addr, probe: shard, key: key}
		}
		return scope{probe: c, key: key}
	}
	return scope{probe: r.e.rdb, key: key}
}

// scopeID is scopeOf(state).id, without the probe key.
func (r *rescue) scopeID(state string) string {
	switch c := r.e.rdb.(type) {
	case *redis.ClusterClient:
		return clusterNode(c, state)
	case *redis.Ring:
		if shard, err := c.GetShardClientForKey(state); err == nil {
			return shard.Options().Addr
		}
	}
	return ""
}

// clusterNode returns the address of the master that c sends key to, or ""
// if c does not know the cluster's layout. With an already cancelled
// context, go-redis answers from the layout it has and never touches the
// network.
func clusterNode(c *redis.ClusterClient, key string) string {
	m, err := c.MasterForKey(cancelledCtx, key)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

var (
	probeTagsOnce sync.Once
	probeTags     *[numSlots]string
)

// probeTag returns a short hash tag (1 to 3 letters or digits) whose slot
// is slot. The table of all 16384 is built on first use, in about 1ms.
func probeTag(slot int) string {
	probeTagsOnce.Do(buildProbeTags)
	return probeTags[slot]
}

// buildProbeTags gives each slot the first string of letters and digits,
// shortest first, whose slot it is. Strings of up to 3 characters cover
// every slot; the CRC of a string is carried on from its prefix's.
func buildProbeTags() {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var (
		found [numSlots][4]byte // the tag, and its length in the last byte
		left  = numSlots
		walk  func(prefix []byte, crc uint16, depth int)
	)
	walk = func(prefix []byte, crc uint16, depth int) {
		for i := 0; i < len(digits) && left > 0; i++ {
			c := hashslot.Next(crc, digits[i])
			s := append(prefix, digits[i])
			if depth == 1 {
				if t := &found[c%numSlots]; t[3] == 0 {
					copy(t[:], s)
					t[3] = byte(len(s))
					left--
				}
				continue
			}
			walk(s, c, depth-1)
		}
	}
	for n := 1; left > 0 && n <= 4; n++ {
		walk(make([]byte, 0, 4), 0, n)
	}
	// One string holds every tag; each tag is a slice of it.
	var all []byte
	var ends [numSlots]int
	for i := range found {
		all = append(all, found[i][:found[i][3]]...)
		ends[i] = len(all)
	}
	s := string(all)
	tags := new([numSlots]string)
	for i := range tags {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		tags[i] = s[start:ends[i]]
	}
	probeTags = tags
}
