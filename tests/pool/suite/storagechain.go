package suite

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// BackingChain is an image's file and its backing files, top first.
func BackingChain(t *testing.T, image string) []string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--backing-chain", "--output=json", image).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", image, err)
	}
	var infos []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &infos); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range infos {
		names = append(names, filepath.Base(i.Filename))
	}
	return names
}

// SharesHistory checks that the image of the VDI of uuid disk, under
// dir, has below it the image the VDI of uuid snap is a top over.
func SharesHistory(t *testing.T, dir, disk, snap string) {
	t.Helper()
	chain := BackingChain(t, FileNamed(t, dir, disk))
	sc := BackingChain(t, FileNamed(t, dir, snap))
	if len(sc) < 2 || !slices.Contains(chain, sc[1]) {
		t.Fatalf("the snapshot's image %v shares nothing with the disk's %v", sc, chain)
	}
}
