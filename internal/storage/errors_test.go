package storage

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"toolstackd/internal/xerr"
)

// forClient hides absolute paths in what a transfer's client is told,
// whatever put them there (an os.PathError, qemu-img's message), and
// leaves the rest of the text, and the error's code, as they were.
func TestForClientHidesPaths(t *testing.T) {
	_, statErr := os.Stat("/nonexistent/spool/import-1.qcow2")
	for _, c := range []struct {
		in   error
		code string
		want []string
	}{
		{BackendError(smVDIUnavailable, fmt.Errorf("staging the upload: %w", statErr).Error()), "SR_BACKEND_FAILURE_46",
			[]string{"", "staging the upload: stat (path hidden): no such file or directory", ""}},
		{xerr.New(xerr.ImportError, "qemu-img map: qemu-img: Could not open '/data/storage/spool/import-7.qcow2': Image is too big"),
			xerr.ImportError, []string{"qemu-img map: qemu-img: Could not open '(path hidden)': Image is too big"}},
		{xerr.New(xerr.ImportError, "/srv/x (and [/srv/y], a=/srv/z)"), xerr.ImportError,
			[]string{"(path hidden) (and [(path hidden)], a=(path hidden))"}},
		{errors.New("write /var/lib/toolstackd/nbd.sock: broken pipe"), xerr.InternalError,
			[]string{"write (path hidden): broken pipe"}},
		// Nothing to hide: the same error comes back.
		{xerr.New(xerr.VDITooSmall, "OpaqueRef:1", "9223372036854779904"), xerr.VDITooSmall, []string{"OpaqueRef:1", "9223372036854779904"}},
		{xerr.New(xerr.ImportError, "see http://host/doc, 4/8 done, a / b"), xerr.ImportError, []string{"see http://host/doc, 4/8 done, a / b"}},
	} {
		got := xerr.From(forClient(c.in))
		if got.Code != c.code || !slices.Equal(got.Params, c.want) {
			t.Errorf("forClient(%v) = %s %q, want %s %q", c.in, got.Code, got.Params, c.code, c.want)
		}
	}
	same := xerr.New(xerr.VDITooSmall, "OpaqueRef:1", "1")
	if forClient(same) != error(same) {
		t.Error("an error with no path was rebuilt")
	}
	if forClient(nil) != nil {
		t.Error("forClient(nil) is not nil")
	}
}

// The spool limit of a qcow2 upload grows with the disk and stays short
// of math.MaxInt64 (the copy asks for one byte more), whatever the size.
func TestSpoolLimitNeverOverflows(t *testing.T) {
	prev := int64(-1)
	for _, size := range []int64{-1, 0, 1 << 20, 64 << 40, math.MaxInt64 / 2, math.MaxInt64/65*64 - 1, math.MaxInt64/65*64 + 1, math.MaxInt64 - 1, math.MaxInt64} {
		l := spoolLimit(size)
		if l < min(max(size, 0), math.MaxInt64-1) || l == math.MaxInt64 || l < prev {
			t.Errorf("spoolLimit(%d) = %d", size, l)
		}
		prev = l
	}
	if got := spoolLimit(64 << 20); got != 64<<20+1<<20+64<<20 {
		t.Errorf("spoolLimit(64 MiB) = %d", got)
	}
}
