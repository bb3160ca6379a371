package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"toolstackd/internal/nbd"
)

// qemuNBD is a qemu-nbd process serving one image on a Unix socket. It is
// used for transfers into and out of images QEMU formats (qcow2), and
// dies with the daemon.
type qemuNBD struct {
	cmd    *exec.Cmd
	sock   string
	stderr *bytes.Buffer
	exited chan struct{}
	once   sync.Once
}

// runDir returns a directory for sockets whose paths stay under the
// 108-byte limit of a Unix socket address.
func runDir(preferred string) (string, error) {
	if preferred != "" && len(preferred) < 60 {
		if err := os.MkdirAll(preferred, 0o700); err == nil {
			return preferred, nil
		}
	}
	d := filepath.Join(os.TempDir(), fmt.Sprintf("toolstackd-%d", os.Getuid()))
	if len(d) > 60 {
		d = fmt.Sprintf("/tmp/toolstackd-%d", os.Getuid())
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return "", err
	}
	return d, nil
}

func randomName(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// startQemuNBD serves path (in format) until stop. readonly exports it
// read-only and shares the image with a writer that holds it.
func startQemuNBD(ctx context.Context, dir, path, format string, readonly bool) (*qemuNBD, error) {
	sock := filepath.Join(dir, randomName("nbd-")+".sock")
	args := []string{"--socket=" + sock, "--export-name=vdi", "--persistent", "--shared=16",
		"--cache=writeback", "--aio=threads"}
	if readonly {
		// Shared with a guest that has the image open: no image locking
		// (qemu-nbd 7.2 has no --force-share).
		args = append(args, "--read-only", "--image-opts",
			"driver="+format+",file.driver=file,file.locking=off,file.filename="+strings.ReplaceAll(path, ",", ",,"))
	} else {
		args = append(args, "--format="+format, "--discard=unmap", "--detect-zeroes=unmap", path)
	}
	cmd := exec.Command("qemu-nbd", args...) //nolint:gosec // a fixed program with an argv, no shell
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	q := &qemuNBD{cmd: cmd, sock: sock, stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = q.stderr
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, errors.New("qemu-nbd is not installed")
		}
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(q.exited) }() // its stderr says why it exited
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			_ = c.Close()
			return q, nil
		}
		select {
		case <-q.exited:
			_ = os.Remove(sock)
			return nil, fmt.Errorf("qemu-nbd: %s", strings.TrimSpace(q.stderr.String()))
		case <-ctx.Done():
			_ = q.stop()
			return nil, ctx.Err()
		case <-deadline.C:
			_ = q.stop()
			return nil, errors.New("qemu-nbd did not start")
		case <-time.After(3 * time.Millisecond):
		}
	}
}

// uri is where the server's one export is.
func (q *qemuNBD) uri() nbd.URI { return nbd.URI{Network: "unix", Socket: q.sock, Export: "vdi"} }

// stop ends the server (it flushes the image as it closes) and removes
// its socket.
func (q *qemuNBD) stop() error {
	var err error
	q.once.Do(func() {
		_ = q.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-q.exited:
		case <-time.After(30 * time.Second):
			_ = q.cmd.Process.Kill()
			<-q.exited
			err = errors.New("qemu-nbd did not stop; killed")
		}
		_ = os.Remove(q.sock)
	})
	return err
}
