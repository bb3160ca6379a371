// Package kernel runs the tests of network datapaths this machine's
// kernel may lack (802.1Q VLANs, bonding, Open vSwitch's kernel
// datapath) under the distribution's own kernel, in a VM
// (internal/testkit/kernelvm), so that they are exercised on a kernel that has
// them wherever CI runs, not only where the machine's kernel happens to.
package kernel_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/kernelvm"
	"toolstackd/internal/testkit/ovstest"
	"toolstackd/internal/testkit/testdaemon"
)

// suite is a package's test binary and the tests run from it in the VM.
type suite struct {
	pkg string
	run string // -test.run
}

// inVM builds the suites' test binaries (static), boots the
// distribution's kernel with modules and files, runs them there and
// returns their output.
func inVM(t *testing.T, modules []string, files map[string]string, suites ...suite) string {
	t.Helper()
	if os.Getenv(kernelvm.InGuest) == "1" {
		t.Skip("already in the VM")
	}
	if why := kernelvm.Available(modules...); why != "" {
		t.Skip("NOT exercised under the distribution's kernel: " + why)
	}
	dir := t.TempDir()
	var script []string
	for _, s := range suites {
		bin := filepath.Join(dir, filepath.Base(s.pkg)+".test")
		cmd := exec.Command("go", "test", "-c", "-o", bin, s.pkg)
		cmd.Dir = testdaemon.SourceRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", s.pkg, err, out)
		}
		guest := "/kernelvm/bin/" + filepath.Base(bin)
		files[guest] = bin
		script = append(script, guest+" -test.v -test.count=1 -test.timeout=5m -test.run '"+s.run+"' || rc=1")
	}
	// A run takes about a minute under TCG on a quiet machine.
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := kernelvm.Run(ctx, kernelvm.Spec{Modules: modules, Files: files,
		Argv: []string{"sh", "-c", "rc=0; " + strings.Join(script, "; ") + "; exit $rc"}})
	t.Logf("kernel %s, booted in %v, whole run %v", res.Kernel, res.Boot.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	if testing.Verbose() || res.ExitCode != 0 {
		t.Logf("in the VM:\n%s", res.Output)
	}
	if res.ExitCode != 0 {
		t.Errorf("the tests in the VM exited %d", res.ExitCode)
	}
	return res.Output
}

// passed checks that each named test passed (not skipped) in out.
func passed(t *testing.T, out string, names ...string) {
	t.Helper()
	for _, name := range names {
		if !regexp.MustCompile(`(?m)^--- PASS: ` + name + ` `).MatchString(out) {
			t.Errorf("%s did not pass under the distribution's kernel", name)
		}
	}
}

func TestVLANAndBondDatapaths(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the datapath tests need network namespaces")
	}
	out := inVM(t, []string{"veth", "bridge", "8021q", "bonding", "vxlan", "tun"},
		map[string]string{"/usr/sbin/ip": "/usr/sbin/ip", "/usr/sbin/bridge": "/usr/sbin/bridge"},
		suite{"./internal/network", "^(TestVLANDatapathThroughAPI|TestBondDatapathThroughAPI)$"},
		suite{"./internal/network/netlinkx", "^(TestKernelDetails|TestVXLANDatapath|TestGRO)$"})
	passed(t, out, "TestVLANDatapathThroughAPI", "TestBondDatapathThroughAPI", "TestKernelDetails", "TestVXLANDatapath", "TestGRO")
}

// The Open vSwitch backend's tests with the kernel datapath: with the
// openvswitch module loaded the backend's "auto" datapath is "system".
func TestOVSKernelDatapath(t *testing.T) {
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch kernel datapath NOT exercised: " + why)
	}
	files := map[string]string{"/usr/sbin/ip": "/usr/sbin/ip", ovstest.VSwitchSchema: ovstest.VSwitchSchema}
	for _, b := range []string{"ovsdb-server", "ovsdb-tool", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovs-appctl"} {
		p, err := exec.LookPath(b)
		if err != nil {
			t.Skipf("Open vSwitch kernel datapath NOT exercised: %s not installed", b)
		}
		files[p] = p
	}
	out := inVM(t, []string{"veth", "bridge", "tun", "openvswitch"}, files, suite{"./internal/network/ovs", "^Test"})
	if !strings.Contains(out, "datapath type: system") {
		t.Errorf("the Open vSwitch tests in the VM did not use the kernel datapath")
	}
	if n := strings.Count(out, "\n--- PASS: "); n == 0 {
		t.Errorf("no Open vSwitch test passed in the VM")
	}
	if strings.Contains(out, "\n--- FAIL: ") {
		t.Errorf("Open vSwitch tests failed under the distribution's kernel")
	}
}
