package imageformat

import (
	"errors"
	"path/filepath"
	"strings"
)

// FormatOfName is the image format a file's name announces: "qcow2" for
// .qcow2, "raw" for .raw, .img and .iso, "" for anything else.
func FormatOfName(name string) string {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".qcow2":
		return "qcow2"
	case ".raw", ".img", ".iso":
		return "raw"
	}
	return ""
}

// maxChain bounds a backing chain's length.
const maxChain = 1000

// Chain lists an image and its backing files, top first, as paths with
// their formats, reading each qcow2 header in turn. A relative backing
// file name is relative to the directory of the image that names it; a
// backing file without a recorded format is raw when its name says so
// (FormatOfName), qcow2 otherwise. A chain stops at an image that is not
// qcow2, has no backing file or has an external data file; one that
// loops or is longer than 1,000 images is an error.
func Chain(path, format string) (paths, formats []string, err error) {
	seen := map[string]bool{}
	for path != "" {
		if seen[path] || len(paths) >= maxChain {
			return nil, nil, errors.New("backing chain loops or is too long")
		}
		seen[path] = true
		paths, formats = append(paths, path), append(formats, format)
		if format != "qcow2" {
			break
		}
		h, err := ReadQcow2Header(path)
		if err != nil {
			return nil, nil, err
		}
		if h.BackingFile == "" || h.ExternalDataFile {
			break
		}
		next := h.BackingFile
		if !filepath.IsAbs(next) {
			next = filepath.Join(filepath.Dir(path), next)
		}
		path, format = next, h.BackingFormat
		if format == "" {
			format = "qcow2"
			if FormatOfName(next) == "raw" {
				format = "raw"
			}
		}
	}
	return paths, formats, nil
}
