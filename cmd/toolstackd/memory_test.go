package main

import "testing"

func TestMemSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "16GiB": 16 << 30, "512M": 512 << 20, "2T": 2 << 40, "64KiB": 64 << 10, "3g": 3 << 30} {
		var m memSize
		if err := m.Set(in); err != nil || int64(m) != want {
			t.Errorf("%q: %d %v, want %d", in, m, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5G", "G", "9999999T", "12 apples"} {
		var m memSize
		if err := m.Set(bad); err == nil {
			t.Errorf("%q accepted as %d", bad, m)
		}
	}
}

// String reads back through Set, in the largest whole unit.
func TestMemSizeString(t *testing.T) {
	for v, want := range map[int64]string{0: "0", 1000: "1000", 1 << 20: "1MiB", 64 << 20: "64MiB", 1536 << 20: "1536MiB", 16 << 30: "16GiB", 3 << 40: "3TiB", 3 << 10: "3KiB"} {
		m := memSize(v)
		if got := m.String(); got != want {
			t.Errorf("%d: %q, want %q", v, got, want)
		}
		var back memSize
		if err := back.Set(m.String()); err != nil || back != m {
			t.Errorf("%q read back as %d (%v)", m.String(), back, err)
		}
	}
}
