//go:build !linux

package kafkatest

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
