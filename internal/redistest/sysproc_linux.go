package redistest

import "syscall"

// sysProcAttr puts the child in its own process group, so that signals sent
// to the test's terminal do not reach it and Kill can signal the child and
// any process it forked, and asks the kernel to SIGKILL it if the test binary
// dies (for example on a `go test -timeout` panic) before it can stop the
// child. Pdeathsig follows the OS thread that started the child; the Go
// runtime only ends threads whose goroutine exits while locked with
// runtime.LockOSThread, which tests of this module do not do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
