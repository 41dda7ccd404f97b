package nodewatch

import (
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/hashslot"
	"github.com/redlimit/redlimit/internal/outage"
)

// ProbeSuffix ends every probe key, which is <prefix>:{<tag>}:p with a tag
// of 1 to 3 letters or digits chosen for its slot (hashslot.Tag). No
// limiter's state key ends so.
const ProbeSuffix = ":p"

// scope is one Redis node as the watch sees it: what is marked down, and
// how it is probed.
type scope struct {
	id    string         // the node's address; "" for the whole client
	probe redis.Scripter // where its probes go
	key   string         // the probe key
}

// locate returns the scope of the key state, for a limiter with this key
// prefix: the node the client sends it to now. For a *redis.Client (a
// FailoverClient too) that is its one server; for a *redis.ClusterClient,
// the master of the key's slot (by address, so every slot of a dead master
// falls back together, and a slot that fails over comes back when the
// client routes it to the new master); for a *redis.Ring, the shard of the
// key. An *redis.AutoPipeliner does not tell where a key goes, so it is
// one scope, like any other client type. It does not touch the network.
func locate(rdb redis.UniversalClient, prefix, state string) scope {
	key := prefix + ":{" + hashslot.Tag(hashslot.Of(state)) + "}" + ProbeSuffix
	switch c := rdb.(type) {
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
	return scope{probe: rdb, key: key}
}

// nodeID is locate(rdb, prefix, state).id, without the probe key.
func nodeID(rdb redis.UniversalClient, state string) string {
	switch c := rdb.(type) {
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
	m, err := c.MasterForKey(outage.Cancelled, key)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}
