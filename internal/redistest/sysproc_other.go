//go:build unix && !linux

package redistest

import "syscall"

// sysProcAttr puts the child in its own process group, so that signals sent
// to the test's terminal do not reach it and Kill can signal the child and
// any process it forked.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
