package qemu

import (
	"path/filepath"
	"testing"
)

// The nbd block node QEMU gets for each kind of NBD URI, byte for byte,
// and the file node for a plain path.
func TestProtocolNodeJSON(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a.qcow2")
	for _, c := range []struct {
		path string
		ro   bool
		want string
	}{
		{"nbd+unix:///vdi?socket=/run/x.sock", false, `{"driver":"nbd","export":"vdi","read-only":false,"server":{"path":"/run/x.sock","type":"unix"}}`},
		{"nbd://10.0.0.1/exp", true, `{"driver":"nbd","export":"exp","read-only":true,"server":{"host":"10.0.0.1","port":"10809","type":"inet"}}`},
		{"nbd://[::1]:1234/", false, `{"driver":"nbd","export":"","read-only":false,"server":{"host":"::1","port":"1234","type":"inet"}}`},
		{"nbd+unix:///x", false, `{"driver":"nbd","filename":"nbd+unix:///x","read-only":false}`},
		{file, true, `{"driver":"file","filename":"` + file + `","read-only":true}`},
	} {
		if got := jsonArg(protocolNode(c.path, c.ro)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.path, got, c.want)
		}
	}
}
