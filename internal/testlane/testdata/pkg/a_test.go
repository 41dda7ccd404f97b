package pkg

import (
	"testing"

	rt "github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// Direct calls.
func TestDirectStart(t *testing.T)      { rt.Start(t) }
func TestDirectCluster(t *testing.T)    { rt.StartCluster(3, 1) }
func TestDirectAlone(t *testing.T)      { testlane.MarkAlone(t); rt.Start(t) }
func TestDirectHeavy(t *testing.T)      { testlane.MarkHeavy(t) }
func TestVersion(t *testing.T)          { _, _ = rt.ServerVersion() }
func TestNoRedis(t *testing.T)          { rt.Slot("k"); rt.TunedOptions("a") }
func TestNamesAnotherTest(t *testing.T) { _ = TestDirectStart }

// Through helpers, methods and package variables.
func realServer(t testing.TB)    { testlane.MarkServer(t) }
func deeper(t *testing.T)        { realServer(t) }
func TestViaHelper(t *testing.T) { deeper(t) }

type rig struct{}

func (rig) start(t *testing.T)   { rt.Require(t) }
func TestViaMethod(t *testing.T) { var r rig; r.start(t) }

var rigs = []func(*testing.T){func(t *testing.T) {}, deeper}

func TestViaVariable(t *testing.T) {
	for _, r := range rigs {
		r(t)
	}
}

// Not tests.
func Testify(t *testing.T)        { rt.Start(t) }
func TestHelperNoT(x int)         { _ = x }
func BenchmarkStart(b *testing.B) { rt.Start(b) }
func ExampleStart()               {}
