package storage

import (
	"os/exec"
	"testing"
)

func needQemuImg(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed (scripts/install-test-deps.sh installs it)")
	}
}
