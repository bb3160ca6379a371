package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// stream builds a go test -json stream from events written as
// "ACTION PACKAGE [TEST] [| OUTPUT]" (TEST "-" for none); OUTPUT gets a
// newline.
func stream(t *testing.T, lines ...string) string {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		spec, out, hasOut := strings.Cut(l, " | ")
		f := strings.Fields(spec)
		e := map[string]any{"Action": f[0]}
		switch f[0] {
		case "build-output", "build-fail":
			e["ImportPath"] = f[1]
		default:
			e["Package"] = f[1]
		}
		if len(f) > 2 && f[2] != "-" {
			e["Test"] = f[2]
		}
		if len(f) > 3 {
			e["FailedBuild"] = f[3]
		}
		if hasOut {
			e["Output"] = out + "\n"
		}
		j, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// runStream runs stream mode on in and returns its stdout, the summary
// and the exit status.
func runStream(t *testing.T, in string, args ...string) (string, *Summary, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "summary.json")
	var stdout, stderr bytes.Buffer
	status := run(append([]string{"-summary", path}, args...), strings.NewReader(in), &stdout, &stderr)
	s, err := readSummary(path)
	if err != nil {
		t.Fatalf("summary: %v (stderr %q)", err, stderr.String())
	}
	return stdout.String(), s, status
}

func TestPass(t *testing.T) {
	in := stream(t,
		"start p/a",
		"run p/a TestOne",
		"output p/a TestOne | === RUN   TestOne",
		"output p/a TestOne |     a_test.go:3: a log line of a passing test",
		"output p/a TestOne | --- PASS: TestOne (0.00s)",
		"pass p/a TestOne",
		"run p/a TestTwo",
		"output p/a TestTwo | === RUN   TestTwo",
		"output p/a TestTwo | --- PASS: TestTwo (0.00s)",
		"pass p/a TestTwo",
		"output p/a - | PASS",
		"output p/a - | printed by TestMain",
		"output p/a - | ok  \tp/a\t0.01s",
		"pass p/a",
		"start p/none",
		"output p/none - | ?   \tp/none\t[no test files]",
		"skip p/none",
	)
	out, s, status := runStream(t, in)
	if status != 0 {
		t.Errorf("status %d, want 0", status)
	}
	want := "ok  \tp/a\t0.01s\n?   \tp/none\t[no test files]\n"
	if out != want {
		t.Errorf("output\n%q\nwant\n%q", out, want)
	}
	if s.Passed != 2 || s.Failed != 0 || s.Skipped != 0 || len(s.Skips) != 0 || len(s.Failures) != 0 {
		t.Errorf("summary %+v", s)
	}
	if s.Name != "unit" {
		t.Errorf("name %q", s.Name)
	}

	// -v prints every line, as go test -v.
	out, _, _ = runStream(t, in, "-v", "-name", "other")
	if !strings.Contains(out, "=== RUN   TestOne\n    a_test.go:3: a log line of a passing test\n--- PASS: TestOne") {
		t.Errorf("-v output lacks the test's lines:\n%s", out)
	}
}

func TestFail(t *testing.T) {
	in := stream(t,
		"start p/a",
		"run p/a TestGood",
		"output p/a TestGood | === RUN   TestGood",
		"output p/a TestGood | --- PASS: TestGood (0.00s)",
		"pass p/a TestGood",
		"run p/a TestBad",
		"output p/a TestBad | === RUN   TestBad",
		"output p/a TestBad |     a_test.go:9: boom",
		"output p/a TestBad | --- FAIL: TestBad (0.00s)",
		"fail p/a TestBad",
		"output p/a - | FAIL",
		"output p/a - | FAIL\tp/a\t0.01s",
		"fail p/a",
	)
	out, s, status := runStream(t, in)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	want := "=== RUN   TestBad\n    a_test.go:9: boom\n--- FAIL: TestBad (0.00s)\nFAIL\nFAIL\tp/a\t0.01s\n"
	if out != want {
		t.Errorf("output\n%q\nwant\n%q", out, want)
	}
	if s.Passed != 1 || s.Failed != 1 {
		t.Errorf("summary %+v", s)
	}
	if want := []Failure{{Package: "p/a", Test: "TestBad"}}; !reflect.DeepEqual(s.Failures, want) {
		t.Errorf("failures %+v, want %+v", s.Failures, want)
	}
}

func TestSkipReasons(t *testing.T) {
	in := stream(t,
		"start p/a",
		"run p/a TestRoot",
		"output p/a TestRoot | === RUN   TestRoot",
		"output p/a TestRoot |     a_test.go:5: some log first",
		"output p/a TestRoot |     a_test.go:6: needs root",
		"output p/a TestRoot | --- SKIP: TestRoot (0.00s)",
		"skip p/a TestRoot",
		"run p/a TestRoot2",
		"output p/a TestRoot2 | === RUN   TestRoot2",
		"output p/a TestRoot2 |     other_test.go:44:   needs   root",
		"output p/a TestRoot2 | --- SKIP: TestRoot2 (0.00s)",
		"skip p/a TestRoot2",
		"run p/a TestMulti",
		"output p/a TestMulti | === RUN   TestMulti",
		"output p/a TestMulti |     a_test.go:9: first line",
		"output p/a TestMulti |         second line",
		"output p/a TestMulti | --- SKIP: TestMulti (0.00s)",
		"skip p/a TestMulti",
		"run p/a TestNow",
		"output p/a TestNow | === RUN   TestNow",
		"output p/a TestNow | --- SKIP: TestNow (0.00s)",
		"skip p/a TestNow",
		"output p/a - | ok  \tp/a\t0.01s",
		"pass p/a",
	)
	out, s, status := runStream(t, in)
	if status != 0 {
		t.Errorf("status %d, want 0", status)
	}
	if out != "ok  \tp/a\t0.01s\n" {
		t.Errorf("output %q: skipped tests' lines are not printed without -v", out)
	}
	if s.Skipped != 4 {
		t.Errorf("skipped %d, want 4", s.Skipped)
	}
	want := []SkipGroup{
		{Package: "p/a", Reason: "needs root", Count: 2, Tests: []string{"TestRoot", "TestRoot2"}},
		{Package: "p/a", Reason: noReason, Count: 1, Tests: []string{"TestNow"}},
		{Package: "p/a", Reason: "first line second line", Count: 1, Tests: []string{"TestMulti"}},
	}
	if !reflect.DeepEqual(s.Skips, want) {
		t.Errorf("skips\n%+v\nwant\n%+v", s.Skips, want)
	}
}

func TestSubtestsSkipped(t *testing.T) {
	in := stream(t,
		"start p/net",
		"run p/net TestOVS",
		"output p/net TestOVS | === RUN   TestOVS",
		"run p/net TestOVS/bridge",
		"output p/net TestOVS/bridge | === RUN   TestOVS/bridge",
		"output p/net TestOVS/bridge |     ovs_test.go:60: Open vSwitch tests not run: no ovs-vswitchd",
		"output p/net TestOVS/bridge | --- SKIP: TestOVS/bridge (0.00s)",
		"skip p/net TestOVS/bridge",
		"run p/net TestOVS/bond",
		"output p/net TestOVS/bond | === RUN   TestOVS/bond",
		"output p/net TestOVS/bond |     ovs_test.go:60: Open vSwitch tests not run: no ovs-vswitchd",
		"output p/net TestOVS/bond | --- SKIP: TestOVS/bond (0.00s)",
		"skip p/net TestOVS/bond",
		"run p/net TestOVS/plain",
		"output p/net TestOVS/plain | === RUN   TestOVS/plain",
		"output p/net TestOVS/plain | --- PASS: TestOVS/plain (0.00s)",
		"pass p/net TestOVS/plain",
		"output p/net TestOVS | --- PASS: TestOVS (0.00s)",
		"pass p/net TestOVS",
		"output p/net - | ok  \tp/net\t0.01s",
		"pass p/net",
	)
	_, s, status := runStream(t, in)
	if status != 0 {
		t.Errorf("status %d", status)
	}
	if s.Passed != 2 || s.Skipped != 2 {
		t.Errorf("summary %+v", s)
	}
	want := []SkipGroup{{Package: "p/net", Reason: "Open vSwitch tests not run: no ovs-vswitchd", Count: 2, Tests: []string{"TestOVS/bond", "TestOVS/bridge"}}}
	if !reflect.DeepEqual(s.Skips, want) {
		t.Errorf("skips\n%+v\nwant\n%+v", s.Skips, want)
	}
}

func TestBuildFailure(t *testing.T) {
	in := stream(t,
		"build-output p/b_[p/b.test] | # p/b [p/b.test]",
		"build-output p/b_[p/b.test] | b/b.go:2:23: cannot use \"s\" as int value",
		"build-fail p/b_[p/b.test]",
		"start p/b",
		"output p/b - | FAIL\tp/b [build failed]",
		"fail p/b - p/b_[p/b.test]",
		// A build failure no package result accounts for still fails.
		"build-output p/c | # p/c",
		"build-output p/c | c/c.go:1:1: expected 'package'",
		"build-fail p/c",
	)
	// The ImportPaths are written with "_" for the space.
	in = strings.ReplaceAll(in, "_[", " [")
	out, s, status := runStream(t, in)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	for _, w := range []string{"# p/b [p/b.test]\nb/b.go:2:23: cannot use \"s\" as int value\n", "FAIL\tp/b [build failed]\n", "c/c.go:1:1: expected 'package'\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	want := []Failure{
		{Package: "p/b", Reason: `build failed: b/b.go:2:23: cannot use "s" as int value`},
		{Package: "p/c", Reason: "build failed: c/c.go:1:1: expected 'package'"},
	}
	if s.Failed != 2 || !reflect.DeepEqual(s.Failures, want) {
		t.Errorf("failed %d, failures\n%+v\nwant\n%+v", s.Failed, s.Failures, want)
	}
}

func TestTimeout(t *testing.T) {
	in := stream(t,
		"start p/c",
		"run p/c TestQuick",
		"output p/c TestQuick | === RUN   TestQuick",
		"output p/c TestQuick | --- PASS: TestQuick (0.00s)",
		"pass p/c TestQuick",
		"run p/c TestPar",
		"output p/c TestPar | === RUN   TestPar",
		"pause p/c TestPar",
		"output p/c TestPar | === PAUSE TestPar",
		"run p/c TestHang",
		"output p/c TestHang | === RUN   TestHang",
		"run p/c TestHang-2",
		"output p/c TestHang-2 | === RUN   TestHang-2",
		"run p/c TestHang/sub",
		"output p/c TestHang/sub | === RUN   TestHang/sub",
		"output p/c TestHang/sub | panic: test timed out after 15m0s",
		"output p/c TestHang/sub | \trunning tests:",
		"output p/c TestHang/sub | goroutine 5 [running]:",
		"output p/c - | FAIL\tp/c\t900.1s",
		"fail p/c",
	)
	out, s, status := runStream(t, in)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	if !strings.Contains(out, "panic: test timed out after 15m0s\n") || strings.Contains(out, "TestQuick") {
		t.Errorf("output:\n%s", out)
	}
	// The innermost tests that were running fail; TestHang, waiting in
	// t.Run, and the parallel test still paused are not counted.
	want := []Failure{
		{Package: "p/c", Test: "TestHang-2", Reason: "no result: timed out (panic: test timed out after 15m0s)"},
		{Package: "p/c", Test: "TestHang/sub", Reason: "no result: timed out (panic: test timed out after 15m0s)"},
	}
	if s.Failed != 2 || s.Passed != 1 || !reflect.DeepEqual(s.Failures, want) {
		t.Errorf("summary %+v", s)
	}
}

func TestTruncated(t *testing.T) {
	in := stream(t,
		"start p/a",
		"run p/a TestOK",
		"output p/a TestOK | === RUN   TestOK",
		"output p/a TestOK | --- PASS: TestOK (0.00s)",
		"pass p/a TestOK",
		"output p/a - | ok  \tp/a\t0.01s",
		"pass p/a",
		"start p/slow",
		"run p/slow TestSlow",
		"output p/slow TestSlow | === RUN   TestSlow",
		"output p/slow TestSlow |     slow_test.go:10: still going",
		"start p/idle",
	)
	// And the last line cut in the middle.
	in += `{"Action":"output","Package":"p/sl`
	out, s, status := runStream(t, in)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	for _, w := range []string{
		"=== RUN   TestSlow\n    slow_test.go:10: still going\nFAIL\tp/slow [no result: the go test output ended]\n",
		"FAIL\tp/idle [no result: the go test output ended]\n",
		`{"Action":"output","Package":"p/sl` + "\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if s.Passed != 1 || s.Failed != 2 || len(s.Failures) != 2 {
		t.Fatalf("summary %+v", s)
	}
	if f := s.Failures[0]; f.Package != "p/slow" || f.Test != "TestSlow" || !strings.Contains(f.Reason, "output ended") {
		t.Errorf("failure %+v", f)
	}
	if f := s.Failures[1]; f.Package != "p/idle" || f.Test != "" || !strings.Contains(f.Reason, "output ended") {
		t.Errorf("failure %+v", f)
	}
}

func TestPackageFailsOutsideTests(t *testing.T) {
	in := stream(t,
		"start p/a",
		"run p/a TestOK",
		"output p/a TestOK | === RUN   TestOK",
		"output p/a TestOK | --- PASS: TestOK (0.00s)",
		"pass p/a TestOK",
		"output p/a - | testing: race detected outside of test execution",
		"output p/a - | FAIL\tp/a\t0.5s",
		"fail p/a",
		"start p/init",
		"output p/init - | panic: init boom",
		"output p/init - | FAIL\tp/init\t0.01s",
		"fail p/init",
	)
	_, s, status := runStream(t, in)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	want := []Failure{
		{Package: "p/a", Reason: "failed outside any test (see its output)"},
		{Package: "p/init", Reason: "panic: init boom"},
	}
	if s.Failed != 2 || !reflect.DeepEqual(s.Failures, want) {
		t.Errorf("summary %+v", s)
	}
}

func TestWholePackageSkip(t *testing.T) {
	in := stream(t,
		"start p/k",
		"output p/k - | no KVM on this machine: not running",
		"output p/k - | SKIP",
		"skip p/k",
	)
	_, s, status := runStream(t, in)
	if status != 0 {
		t.Errorf("status %d", status)
	}
	want := []SkipGroup{{Package: "p/k", Reason: "no KVM on this machine: not running", Whole: true}}
	if !reflect.DeepEqual(s.Skips, want) {
		t.Errorf("skips %+v", s.Skips)
	}
}

func TestEmptyInput(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if status := run(nil, strings.NewReader("go: no packages\n"), &stdout, &stderr); status != 1 {
		t.Errorf("status %d, want 1: an input without events is a failure", status)
	}
	if stdout.String() != "go: no packages\n" {
		t.Errorf("stdout %q: lines that are not events are printed as they are", stdout.String())
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func summaryFile(t *testing.T, dir, name string, s Summary) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := writeSummary(p, &s); err != nil {
		t.Fatal(err)
	}
	return p
}

func runPrint(args ...string) (string, int) {
	var stdout, stderr bytes.Buffer
	status := run(append([]string{"-print"}, args...), strings.NewReader(""), &stdout, &stderr)
	return stdout.String() + stderr.String(), status
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestPrint(t *testing.T) {
	dir := t.TempDir()
	unit := summaryFile(t, dir, "unit.json", Summary{
		Name: "unit", Passed: 10, Skipped: 6,
		Skips: []SkipGroup{
			{Package: "toolstackd/tests/network", Reason: "needs root and network namespaces", Count: 4, Tests: []string{"TestA", "TestB", "TestC", "TestD"}},
			{Package: "toolstackd/tests/packaging", Reason: "no dpkg", Count: 1, Tests: []string{"TestInstall"}},
			{Package: "toolstackd/tests/kvm", Reason: "no /dev/kvm", Whole: true},
		},
	})
	// A second run whose reasons differ only by a file:line prefix and
	// spaces: one group with the first.
	more := summaryFile(t, dir, "more.json", Summary{
		Name: "unit", Passed: 1, Skipped: 1,
		Skips: []SkipGroup{
			{Package: "toolstackd/tests/network", Reason: "network_test.go:40: needs root and  network namespaces", Count: 1, Tests: []string{"TestE"}},
		},
	})
	e2e := writeFile(t, dir, "e2e.log", "=== e2e suite: xo ===\ne2e suite xo: 5 passed, 0 failed\n=== e2e summary ===\n  xo: 5 passed, 0 failed\n5 passed, 0 failed\n")
	fuzz := writeFile(t, dir, "fuzz.log", "fuzz toolstackd/internal/xva FuzzRead (5s)\nfuzz toolstackd/internal/rrd FuzzParse (5s)\n2 passed, 0 failed\n")

	out, status := runPrint("-stage", "check-generate=0", "-stage", "lint=0", "-stage", "unit=0", "-fuzz", fuzz, "-e2e", e2e, unit, more)
	if status != 0 {
		t.Errorf("status %d, want 0:\n%s", status, out)
	}
	want := `=== test summary
check-generate: ok
lint: ok
unit: 10 passed, 0 failed, 6 skipped
unit: 1 passed, 0 failed, 1 skipped
fuzz: 2 passed, 0 failed
e2e: 5 passed, 0 failed
--- skipped: what this run did not cover (7 tests in 3 groups)
SKIP toolstackd/tests/kvm (whole package): no /dev/kvm
SKIP toolstackd/tests/network (5 tests): needs root and network namespaces (TestA, TestB, TestC and 2 more)
SKIP toolstackd/tests/packaging (1 test): no dpkg (TestInstall)
20 passed, 0 failed, 7 skipped
`
	if out != want {
		t.Errorf("print\n%s\nwant\n%s", out, want)
	}
}

func TestPrintFailures(t *testing.T) {
	dir := t.TempDir()
	unit := summaryFile(t, dir, "unit.json", Summary{
		Name: "unit", Passed: 3, Failed: 2, Skipped: 0,
		Failures: []Failure{
			{Package: "p/a", Test: "TestBad"},
			{Package: "p/b", Reason: "build failed"},
		},
	})
	e2e := writeFile(t, dir, "e2e.log", "e2e suite xo: 4 passed, 1 failed\ne2e suite flood: 3 passed, 0 failed\n7 passed, 1 failed\n")
	fuzz := writeFile(t, dir, "fuzz.log", "fuzz p/x FuzzX (5s)\nFAIL fuzz p/x FuzzX\n0 passed, 1 failed\n")
	out, status := runPrint("-stage", "lint=1", "-stage", "unit=1", "-stage", "fuzz=1", "-stage", "e2e=1", "-fuzz", fuzz, "-e2e", e2e, unit)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	for _, w := range []string{
		"lint: FAIL (exit status 1)\n",
		"FAIL lint (exit status 1)\n",
		"FAIL p/a TestBad\n",
		"FAIL p/b: build failed\n",
		"FAIL fuzz p/x FuzzX\n",
		"FAIL e2e suite xo: 4 passed, 1 failed\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "flood") {
		t.Errorf("a suite that passed is listed as failed:\n%s", out)
	}
	if got, want := lastLine(out), "10 passed, 5 failed, 0 skipped"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

// A stage that failed without counting a failure, a summary that is
// missing and a log without its counts each count as one failure: the
// closing line never says 0 failed for a run that failed.
func TestPrintNeverHidesAFailure(t *testing.T) {
	dir := t.TempDir()
	unit := summaryFile(t, dir, "unit.json", Summary{Name: "unit", Passed: 3})
	e2e := writeFile(t, dir, "e2e.log", "e2e: daemon not found\n")
	out, status := runPrint("-stage", "unit=2", "-e2e", e2e, "-fuzz", filepath.Join(dir, "missing.log"), unit, filepath.Join(dir, "gone.json"))
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	for _, w := range []string{
		"FAIL unit (exit status 2, no failure counted)\n",
		"FAIL gone: no summary",
		"FAIL fuzz: no log",
		`FAIL e2e: no "N passed, N failed" line in`,
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if got, want := lastLine(out), "3 passed, 4 failed, 0 skipped"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

func TestStreamThenPrint(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "unit.json")
	in := stream(t,
		"start p/a",
		"run p/a TestSkipped",
		"output p/a TestSkipped | === RUN   TestSkipped",
		"output p/a TestSkipped |     a_test.go:4: needs /dev/kvm",
		"output p/a TestSkipped | --- SKIP: TestSkipped (0.00s)",
		"skip p/a TestSkipped",
		"run p/a TestBad",
		"output p/a TestBad | --- FAIL: TestBad (0.00s)",
		"fail p/a TestBad",
		"output p/a - | FAIL\tp/a\t0.01s",
		"fail p/a",
	)
	var stdout, stderr bytes.Buffer
	if status := run([]string{"-summary", path}, strings.NewReader(in), &stdout, &stderr); status != 1 {
		t.Errorf("stream status %d, want 1", status)
	}
	out, status := runPrint(path)
	if status != 1 {
		t.Errorf("print status %d, want 1", status)
	}
	want := `=== test summary
unit: 0 passed, 1 failed, 1 skipped
--- failures (1)
FAIL p/a TestBad
--- skipped: what this run did not cover (1 test in 1 group)
SKIP p/a (1 test): needs /dev/kvm (TestSkipped)
0 passed, 1 failed, 1 skipped
`
	if out != want {
		t.Errorf("print\n%s\nwant\n%s", out, want)
	}

	stdout.Reset()
	if status := run([]string{"-failed", path}, nil, &stdout, &stderr); status != 1 || stdout.String() != "p/a TestBad\n" {
		t.Errorf("-failed: status %d, output %q", status, stdout.String())
	}
}

// Package times: go test's Elapsed for each package that has tests, and
// -times lays two runs side by side, longest first.
func TestTimes(t *testing.T) {
	dir := t.TempDir()
	write := func(name, in string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		path := filepath.Join(dir, name+".json")
		run([]string{"-summary", path}, strings.NewReader(in), &stdout, &stderr)
		return path
	}
	ev := func(action, pkg string, secs float64, out string) string {
		j, _ := json.Marshal(map[string]any{"Action": action, "Package": pkg, "Elapsed": secs, "Output": out})
		return string(j) + "\n"
	}
	quiet := write("quiet", ev("output", "p/a", 0, "ok  \tp/a\t3.2s\n")+ev("pass", "p/a", 3.2, "")+
		ev("output", "p/b", 0, "ok  \tp/b\t40s\n")+ev("pass", "p/b", 40, "")+
		ev("output", "p/none", 0, "?   \tp/none\t[no test files]\n")+ev("skip", "p/none", 0, ""))
	loaded := write("loaded", ev("pass", "p/a", 7, "")+ev("fail", "p/b", 600, ""))
	s, err := readSummary(quiet)
	if err != nil || len(s.Packages) != 2 || s.Packages[1] != (PkgTime{"p/b", 40, "pass"}) {
		t.Fatalf("packages %+v, %v", s, err)
	}
	var stdout, stderr bytes.Buffer
	if st := run([]string{"-times", quiet, loaded}, nil, &stdout, &stderr); st != 0 {
		t.Fatalf("status %d: %s", st, stderr.String())
	}
	want := "| package | quiet (s) | loaded (s) |\n|---|---:|---:|\n" +
		"| p/b | 40 | 600 (fail) |\n| p/a | 3 | 7 |\n| all packages, added up | 43 | 607 |\n"
	if stdout.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", stdout.String(), want)
	}
}

// A package's text reaches the output when its result arrives, not when
// the whole run ends.
func TestFlushedPerPackage(t *testing.T) {
	var out bytes.Buffer
	c := newCollector(&out, false)
	for _, l := range strings.SplitAfter(stream(t,
		"start p/a",
		"output p/a - | ok  \tp/a\t0.01s",
		"pass p/a",
		"start p/b",
	), "\n") {
		if l != "" {
			c.line(l)
		}
	}
	if out.String() != "ok  \tp/a\t0.01s\n" {
		t.Fatalf("before the run ended: %q", out.String())
	}
}
