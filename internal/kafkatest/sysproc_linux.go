package kafkatest

import "syscall"

// sysProcAttr has the kernel kill a broker whose test process died without
// running its cleanups (a timeout panic, a SIGKILL), so that no JVM
// outlives the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
