package xenops

import "testing"

// The emulator opens an NBD export by its URI and anything else by its
// path, whatever else the source carries.
func TestDiskSourceTarget(t *testing.T) {
	for _, c := range []struct {
		src  DiskSource
		want string
	}{
		{DiskSource{Kind: DiskFile, Path: "/srv/a.qcow2", NBDURI: "nbd://ignored/x", Format: "qcow2"}, "/srv/a.qcow2"},
		{DiskSource{Kind: DiskNBD, Path: "/ignored", NBDURI: "nbd+unix:///e?socket=/run/s", Format: "raw"}, "nbd+unix:///e?socket=/run/s"},
		{DiskSource{Path: "/dev/sdb"}, "/dev/sdb"},
	} {
		if got := c.src.Target(); got != c.want {
			t.Errorf("%+v: Target() = %q, want %q", c.src, got, c.want)
		}
	}
}
