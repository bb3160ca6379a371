package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
)

// qemuImg runs qemu-img and returns its standard output. A failure carries
// qemu-img's own message.
func qemuImg(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "qemu-img", args...) //nolint:gosec // a fixed program with an argv, no shell
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		if errors.Is(err, exec.ErrNotFound) {
			msg = "qemu-img is not installed"
		}
		return nil, fmt.Errorf("qemu-img %s: %s", args[0], msg)
	}
	return stdout.Bytes(), nil
}

// extent is one run of a disk as `qemu-img map` reports it: where the data
// of the guest range [Start, Start+Length) lives.
type extent struct {
	Start   int64  `json:"start"`
	Length  int64  `json:"length"`
	Depth   int    `json:"depth"`   // 0: the top image; n: n images down the chain
	Present bool   `json:"present"` // false: no image in the chain has it (reads as zero)
	Zero    bool   `json:"zero"`
	Data    bool   `json:"data"`
	Offset  *int64 `json:"offset,omitempty"` // where the data is in the image at Depth
}

// parseMap decodes `qemu-img map --output=json` and checks that the
// extents cover [0, size) in order.
func parseMap(b []byte, size int64) ([]extent, error) {
	var exts []extent
	if err := json.Unmarshal(b, &exts); err != nil {
		return nil, fmt.Errorf("qemu-img map: %w", err)
	}
	var next int64
	for _, e := range exts {
		if e.Start != next || e.Length <= 0 || e.Depth < 0 || (e.Offset != nil && *e.Offset < 0) {
			return nil, fmt.Errorf("qemu-img map: bad extent at %d", e.Start)
		}
		next = e.Start + e.Length
		if next < e.Start {
			return nil, errors.New("qemu-img map: extent overflows")
		}
	}
	if size >= 0 && next != size {
		return nil, fmt.Errorf("qemu-img map covers %d bytes, not %d", next, size)
	}
	return exts, nil
}

// imageMap maps an image and its backing chain. force shares the image
// with a writer that holds it open (a running VM), as QEMU's -U does.
func imageMap(ctx context.Context, path, format string, size int64) ([]extent, error) {
	out, err := qemuImg(ctx, "map", "-U", "--output=json", "-f", format, path)
	if err != nil {
		return nil, err
	}
	return parseMap(out, size)
}
