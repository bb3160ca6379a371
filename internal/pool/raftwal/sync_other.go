//go:build !linux

package raftwal

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
