package qemu

import (
	"strings"
	"testing"

	"toolstackd/internal/xenops/backend"
)

func TestQEMUArgv(t *testing.T) {
	q := &QEMU{cfg: Config{OVMFCode: "/ovmf/code"}}
	j := &qemuJournal{UUID: "u", Accel: "tcg", Dir: "/d", QMPPath: "/d/q", VNCPath: "/d/v", SerialPath: "/d/s",
		Spec: backend.Spec{UUID: "u", Name: "a,b", Memory: 256 << 20, VCPUs: 1, MaxCPU: 4, Firmware: "uefi", BootOrder: "dc",
			Platform: map[string]string{"cores-per-socket": "2"}},
		Disks: []backend.Disk{{VBD: "b0", Device: "0", Path: "/x.qcow2", Format: "qcow2", Bootable: true}, {VBD: "b3", Device: "3", CD: true}},
		NICs:  []backend.NIC{{VIF: "v0", Device: "0", MAC: "02:00:00:00:00:01", Mode: "user"}}}
	a, err := q.qemuArgv(j, nil)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(a, " ")
	for _, want := range []string{"guest=a,,b", "-smp 1,maxcpus=4,sockets=2,cores=2,threads=1", "-m 256", "accel=tcg", "-S",
		`"bootindex":1`, `"driver":"ide-cd"`, `"bus":"ide.1"`, `"addr":"0xb"`, `"addr":"0x4"`, "if=pflash", "file=/ovmf/code",
		`"driver":"qcow2"`, `"filename":"/x.qcow2"`} {
		if !strings.Contains(line, want) {
			t.Errorf("command line lacks %s:\n%s", want, line)
		}
	}
	// The CD boots first (order dc), then the disk.
	for _, want := range []string{`{"bootindex":1,"bus":"ide.1","driver":"ide-cd","id":"vbd3","unit":1}`,
		`{"addr":"0xb","bootindex":2,"drive":"vbd0-fmt","driver":"virtio-blk-pci","id":"vbd0"}`} {
		if !strings.Contains(line, want) {
			t.Errorf("command line lacks %s:\n%s", want, line)
		}
	}
	j.Disks = append(j.Disks, backend.Disk{Device: "7", CD: true})
	if _, err := q.qemuArgv(j, nil); err == nil {
		t.Error("a CD beyond the IDE slots was accepted")
	}
}
