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
