// Package version holds the version of this build of toolstackd and xe.
package version

// Version is set when the binaries are built from a git checkout (the
// Makefile passes `git describe --tags --always --dirty` with
// -ldflags -X toolstackd/internal/version.Version=...); a plain `go build`
// leaves "dev".
var Version = "dev"
