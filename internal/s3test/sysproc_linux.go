package s3test

import "syscall"

// sysProcAttr has the kernel kill a server whose test process died without
// running its cleanups (a timeout panic, a SIGKILL), so that no server
// outlives the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
