package redlimit

import (
	"context"
	"log"
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// The package's shared real Redis and Redis Cluster, started on first use
// and stopped when the tests end. Tests that break a server start their own.
var (
	sharedServerOnce sync.Once
	sharedServer     *redistest.Server
	sharedServerErr  error

	sharedClusterOnce sync.Once
	sharedCluster     *redistest.Cluster
	sharedClusterErr  error
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests make many on purpose.
	redis.SetLogger(quietLogger{})
	log.SetFlags(0)
	// Every limiter of the suite with fixed rules runs its script with the
	// rules written in (the default); TestBakedScriptsBounded checks the
	// bound itself.
	maxBakedScripts = 1 << 20
	// REDLIMIT_TEST_FUNCTIONS=1 (test.sh) runs the suite with every
	// limiter on Redis Functions (WithRedisFunctions).
	functionsByDefault = os.Getenv("REDLIMIT_TEST_FUNCTIONS") == "1"
	code := m.Run()
	if sharedServer != nil {
		sharedServer.Close()
	}
	if sharedCluster != nil {
		sharedCluster.Close()
	}
	os.Exit(code)
}

// realServer returns the shared redis-server, skipping (or failing, with
// REDLIMIT_REQUIRE_REDIS=1) when redis-server is not installed.
func realServer(t testing.TB) *redistest.Server {
	t.Helper()
	testlane.MarkServer(t) // before the server starts, in a lane that has none
	sharedServerOnce.Do(func() { sharedServer, sharedServerErr = redistest.StartServer() })
	redistest.SkipOrFail(t, sharedServerErr)
	return sharedServer
}

// realCluster returns the shared Redis Cluster: 3 masters, 1 replica each.
// Six processes: a test on it runs alone (see internal/testlane).
func realCluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	testlane.MarkAlone(t)
	sharedClusterOnce.Do(func() { sharedCluster, sharedClusterErr = redistest.StartCluster(3, 1) })
	redistest.SkipOrFail(t, sharedClusterErr)
	return sharedCluster
}

// serverVersion returns the engine the real-Redis tests run on (see
// redistest.ServerVersion), for a test that asserts what differs between
// engines.
func serverVersion(t testing.TB) redistest.Version {
	t.Helper()
	v, err := redistest.ServerVersion()
	redistest.SkipOrFail(t, err)
	return v
}
