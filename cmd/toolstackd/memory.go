package main

import (
	"fmt"
	"strconv"
	"strings"
)

// memSize is a flag's amount of memory: bytes, or a number with a unit
// (K, M, G, T, with or without "iB"; powers of 1024).
type memSize int64

// String is the amount in the largest unit that holds it whole (64MiB),
// as Set reads it back.
func (m *memSize) String() string {
	if *m == 0 {
		return "0"
	}
	v := int64(*m)
	for _, u := range []struct {
		name  string
		shift uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if v%(1<<u.shift) == 0 {
			return strconv.FormatInt(v>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(v, 10)
}

func (m *memSize) Type() string { return "size" }

func (m *memSize) Set(s string) error {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(s), "B"), "i")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K', 'k':
			shift = 10
		case 'M', 'm':
			shift = 20
		case 'G', 'g':
			shift = 30
		case 'T', 't':
			shift = 40
		}
		if shift > 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || v < 0 || v > (1<<62)>>shift {
		return fmt.Errorf("%q is not an amount of memory (bytes, or a number with K, M, G or T)", s)
	}
	*m = memSize(v << shift)
	return nil
}
