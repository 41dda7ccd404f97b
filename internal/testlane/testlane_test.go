package testlane

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	got, err := Classify("testdata/pkg")
	require.NoError(t, err)
	assert.Equal(t, map[string]Lane{
		"TestDirectStart":      Servers,
		"TestDirectCluster":    Alone,
		"TestDirectAlone":      Alone, // the highest of its marks
		"TestDirectHeavy":      Heavy,
		"TestVersion":          Servers,
		"TestNoRedis":          CPU,
		"TestNamesAnotherTest": CPU, // naming a test does not run it
		"TestViaHelper":        Servers,
		"TestViaMethod":        Servers,
		"TestViaVariable":      Servers,
		"TestExternal":         Servers,
		"Test1":                CPU,
	}, got)
	assert.Equal(t, []string{"TestDirectAlone", "TestDirectCluster"}, Select(got, Alone))
	assert.Empty(t, Select(map[string]Lane{"TestA": CPU}, Alone))
}

func TestClassifyBadSource(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x_test.go"), []byte("package x\n\nfunc TestX(t *testing.T) {\n"), 0o600))
	_, err := Classify(dir)
	require.ErrorContains(t, err, "testlane: ")
}

func TestMisplaced(t *testing.T) {
	for _, tc := range []struct {
		mark, running Lane
		want          bool
	}{
		{Servers, "", false}, // without a lane every test runs
		{Alone, "", false},
		{Servers, CPU, true}, // a server in the cpu lane: the analysis missed it
		{Servers, Heavy, true},
		{Servers, Servers, false},
		{Servers, Alone, false}, // an alone test starts its servers
		{Alone, Servers, true},
		{Heavy, CPU, true},
		{Heavy, Servers, false},
		{CPU, CPU, false},
	} {
		assert.Equal(t, tc.want, misplaced(tc.mark, tc.running), "%s test in the %q lane", tc.mark, tc.running)
	}
}
