package pkg_test

import (
	"testing"

	"github.com/redlimit/redlimit/internal/redistest"
)

// An external test package of the same directory, its own import name.
func TestExternal(t *testing.T) { redistest.Start(t) }

// Test1 is a test: a digit is not lower case.
func Test1(t *testing.T) {}
