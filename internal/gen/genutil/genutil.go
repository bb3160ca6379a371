// Package genutil is what toolstackd's code generators share: reading
// their JSON inputs and writing their outputs. The generators are the
// commands run by `go generate` (internal/datamodel/gen,
// internal/cli/gen, internal/xerr/gen); each is a small main that reads
// the repository's own data files and writes files into the tree.
//
// A generator has no caller to return an error to, so every function here
// ends the process with log.Fatal on failure, naming the file concerned.
// Go source is passed through gofmt before it is written: what is
// committed is exactly what gofmt prints, so `go generate` followed by
// `git status` shows no change unless the inputs or a generator changed.
// Source gofmt rejects is written next to its target as <path>.broken
// (mode 0600) so that the generator's mistake can be read, and the
// target is left as it was.
//
// Generated files are written world-readable (0644): they are source and
// documentation in the repository, not secrets.
package genutil

import (
	"bytes"
	"encoding/json"
	"go/format"
	"log"
	"os"
)

// ReadJSON decodes the JSON file at path into v. Fields of the file that
// v has no place for are ignored, as for a published document (the
// XenAPI datamodel, the error list) of which a generator reads a part.
func ReadJSON(path string, v any) {
	if err := json.Unmarshal(read(path), v); err != nil {
		log.Fatalf("%s: %v", path, err) //nolint:gosec // the developer's own file name, to the developer's terminal
	}
}

// ReadJSONStrict decodes the JSON file at path into v, and a field v has
// no place for is fatal: for files written for toolstackd, where an
// unknown field is a misspelling that would otherwise be dropped without
// a word.
func ReadJSONStrict(path string, v any) {
	dec := json.NewDecoder(bytes.NewReader(read(path)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		log.Fatalf("%s: %v", path, err) //nolint:gosec // as in ReadJSON
	}
}

func read(path string) []byte {
	b, err := os.ReadFile(path) //nolint:gosec // a generator reads the repository's own files, named on its command line
	if err != nil {
		log.Fatal(err)
	}
	return b
}

// WriteGo formats Go source with gofmt and writes it to path. The caller
// writes the "// Code generated ... DO NOT EDIT." line first in src.
func WriteGo(path string, src []byte) {
	out, err := format.Source(src)
	if err != nil {
		_ = os.WriteFile(path+".broken", src, 0o600) //nolint:gosec // next to the target the generator was told to write: a debugging aid on the way to the fatal error
		log.Fatalf("gen: %s: %v", path, err)         //nolint:gosec // as in ReadJSON
	}
	WriteFile(path, out)
}

// WriteFile writes a generated file that is not Go (documentation) as it
// is.
func WriteFile(path string, b []byte) {
	if err := os.WriteFile(path, b, 0o644); err != nil { //nolint:gosec // generated files in the tree are world-readable
		log.Fatal(err)
	}
}
