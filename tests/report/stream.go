package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent, and the
// build-output and build-fail events go test adds for the build).
type event struct {
	Action      string
	Package     string
	ImportPath  string // build-output, build-fail
	Test        string
	Output      string
	FailedBuild string  // on a package's fail: the package whose build failed
	Elapsed     float64 // seconds, on a result
}

// Summary is what a run covered; -summary writes it as JSON, -print reads it.
type Summary struct {
	Name     string      `json:"name"`
	Passed   int         `json:"passed"`
	Failed   int         `json:"failed"`
	Skipped  int         `json:"skipped"`
	Failures []Failure   `json:"failures,omitempty"`
	Skips    []SkipGroup `json:"skips,omitempty"`
	Packages []PkgTime   `json:"packages,omitempty"`
}

// PkgTime is how long one package's tests ran (go test's own figure: its
// test binary's run, not its build) and how they ended.
type PkgTime struct {
	Package string  `json:"package"`
	Seconds float64 `json:"seconds"`
	Result  string  `json:"result"`
}

// Failure is a failed test, or a package that failed with no failed test
// (Test is empty): a build failure, a crash or timeout outside any test, a
// result that never came.
type Failure struct {
	Package string `json:"package"`
	Test    string `json:"test,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// SkipGroup is the skipped tests of one package with one reason (the
// last message each logged before it skipped, without its file:line), or
// a whole package that skipped (Whole, no tests).
type SkipGroup struct {
	Package string   `json:"package"`
	Reason  string   `json:"reason"`
	Count   int      `json:"count"`
	Tests   []string `json:"tests,omitempty"`
	Whole   bool     `json:"whole_package,omitempty"`
}

const noReason = "(no reason given)"

// collector follows a go test -json stream: it prints the output of each
// package when the package's result arrives and counts the results.
type collector struct {
	out        *bufio.Writer
	verbose    bool
	sawEvents  bool
	pkgs       map[string]*pkgState
	order      []string          // packages in the order they first appeared
	buildFails map[string]string // ImportPath of a build-fail event -> first error line
	buildFirst map[string]string // ImportPath -> first line of its build output that is not "# ..."
	reported   map[string]bool   // FailedBuild values that a package's fail accounted for
	skips      map[skipKey]*SkipGroup
	sum        Summary
}

type skipKey struct{ pkg, reason string }

type pkgState struct {
	name  string
	done  bool
	lines []outLine // output in arrival order
	tests map[string]*testState
	// failedTests counts this package's failed tests, unfinished ones included.
	failedTests int
	// notable is the first line of output that tells why a binary died:
	// "panic: ..." (a test timed out, a crash), "fatal error: ...".
	notable string
}

type outLine struct{ test, text string }

type testState struct {
	status string   // run, pause, pass, fail, skip
	lines  []string // the test's own output, while it runs
}

func newCollector(w io.Writer, verbose bool) *collector {
	return &collector{
		out:        bufio.NewWriter(w),
		verbose:    verbose,
		pkgs:       map[string]*pkgState{},
		buildFails: map[string]string{},
		buildFirst: map[string]string{},
		reported:   map[string]bool{},
		skips:      map[skipKey]*SkipGroup{},
	}
}

// read consumes the stream. Lines that are not events (go test's own
// messages when stderr is merged in) are printed as they are.
func (c *collector) read(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			c.line(line)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (c *collector) line(line string) {
	var e event
	if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &e) == nil && e.Action != "" {
		c.sawEvents = true
		c.event(e)
		return
	}
	if !strings.HasSuffix(line, "\n") {
		line += "\n"
	}
	c.out.WriteString(line)
}

func (c *collector) pkg(name string) *pkgState {
	p := c.pkgs[name]
	if p == nil {
		p = &pkgState{name: name, tests: map[string]*testState{}}
		c.pkgs[name] = p
		c.order = append(c.order, name)
	}
	return p
}

func (c *collector) event(e event) {
	switch e.Action {
	case "build-output":
		c.out.WriteString(e.Output)
		if _, ok := c.buildFirst[e.ImportPath]; !ok {
			if t := strings.TrimSpace(e.Output); t != "" && !strings.HasPrefix(t, "#") {
				c.buildFirst[e.ImportPath] = t
			}
		}
		return
	case "build-fail":
		c.buildFails[e.ImportPath] = c.buildFirst[e.ImportPath]
		return
	}
	if e.Package == "" {
		// Not an event about a package: print what it says.
		c.out.WriteString(e.Output)
		return
	}
	p := c.pkg(e.Package)
	if p.done {
		// Nothing follows a package's result; print a straggler anyway.
		c.out.WriteString(e.Output)
		return
	}
	if e.Test == "" {
		switch e.Action {
		case "output":
			p.output("", e.Output)
		case "pass", "fail", "skip":
			c.endPackage(p, e)
		}
		return
	}
	t := p.tests[e.Test]
	switch e.Action {
	case "run":
		p.tests[e.Test] = &testState{status: "run"}
	case "pause":
		if t != nil {
			t.status = "pause"
		}
	case "cont":
		if t != nil {
			t.status = "run"
		}
	case "output":
		p.output(e.Test, e.Output)
	case "pass":
		c.sum.Passed++
		p.result(e.Test, "pass")
	case "fail":
		c.sum.Failed++
		p.failedTests++
		c.sum.Failures = append(c.sum.Failures, Failure{Package: p.name, Test: e.Test})
		p.result(e.Test, "fail")
	case "skip":
		c.sum.Skipped++
		var lines []string
		if t != nil {
			lines = t.lines
		}
		c.addSkip(p.name, skipReason(lines), e.Test)
		p.result(e.Test, "skip")
	}
}

func (p *pkgState) output(test, text string) {
	p.lines = append(p.lines, outLine{test: test, text: text})
	if test != "" {
		if t := p.tests[test]; t != nil && (t.status == "run" || t.status == "pause") {
			t.lines = append(t.lines, text)
		}
	}
	if p.notable == "" {
		s := strings.TrimSpace(text)
		if strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: ") {
			p.notable = s
		}
	}
}

func (p *pkgState) result(test, status string) {
	t := p.tests[test]
	if t == nil {
		t = &testState{}
		p.tests[test] = t
	}
	t.status = status
	t.lines = nil
}

func (c *collector) addSkip(pkg, reason, test string) {
	k := skipKey{pkg, reason}
	g := c.skips[k]
	if g == nil {
		g = &SkipGroup{Package: pkg, Reason: reason}
		c.skips[k] = g
	}
	if test != "" {
		g.Count++
		g.Tests = append(g.Tests, test)
	} else {
		g.Whole = true
	}
}

// unfinished returns the tests of p that started and have no result, the
// innermost only (a parent waits in t.Run for the subtest that hangs), and
// not the parallel ones still waiting for their turn.
func (p *pkgState) unfinished() []string {
	var running []string
	for name, t := range p.tests {
		if t.status == "run" {
			running = append(running, name)
		}
	}
	sort.Strings(running)
	var leaves []string
outer:
	for _, name := range running {
		for _, other := range running {
			if strings.HasPrefix(other, name+"/") {
				continue outer
			}
		}
		leaves = append(leaves, name)
	}
	return leaves
}

// endPackage handles a package's result (e has no Action at the end of
// the input, for a package that never had one): it accounts for failures
// the tests' own results do not show and prints the package's output.
func (c *collector) endPackage(p *pkgState, e event) {
	p.done = true
	// A package's text goes out as soon as it has its result: a CI log
	// shows how far a long run has come, and what a killed run had done.
	defer c.out.Flush()
	if !p.noTestFiles() {
		c.sum.Packages = append(c.sum.Packages, PkgTime{Package: p.name, Seconds: e.Elapsed, Result: e.Action})
	}
	if e.Action == "skip" {
		if reason, ok := packageSkipReason(p); ok {
			c.addSkip(p.name, reason, "")
		}
	}
	if e.Action == "fail" || e.Action == "" {
		var why string
		switch {
		case e.FailedBuild != "":
			c.reported[e.FailedBuild] = true
			why = "build failed"
			for _, l := range p.lines {
				if strings.Contains(l.text, "[setup failed]") {
					why = "setup failed"
				}
			}
			if first := c.buildFirst[e.FailedBuild]; first != "" {
				why += ": " + first
			}
		case e.Action == "":
			why = "no result: the go test output ended before this package's (go test killed?)"
		case strings.HasPrefix(p.notable, "panic: test timed out"):
			why = "timed out (" + p.notable + ")"
		case p.notable != "":
			why = p.notable
		}
		for _, name := range p.unfinished() {
			c.sum.Failed++
			p.failedTests++
			r := "no result"
			if why != "" {
				r += ": " + why
			}
			c.sum.Failures = append(c.sum.Failures, Failure{Package: p.name, Test: name, Reason: r})
			p.tests[name].status = "fail"
		}
		if p.failedTests == 0 {
			if why == "" {
				why = "failed outside any test (see its output)"
			}
			c.sum.Failed++
			c.sum.Failures = append(c.sum.Failures, Failure{Package: p.name, Reason: why})
		}
	}
	lines := p.lines
	if !c.verbose && e.Action == "pass" {
		// go test without -v prints only the "ok" line of a package
		// that passed.
		var ok []outLine
		for _, l := range lines {
			if l.test == "" && strings.HasPrefix(l.text, "ok ") {
				ok = append(ok, l)
			}
		}
		if len(ok) > 0 {
			lines = ok
		}
	}
	for _, l := range lines {
		if c.verbose || l.test == "" {
			c.out.WriteString(l.text)
			continue
		}
		// As go test without -v: the output of the tests that did not
		// pass or skip.
		if t := p.tests[l.test]; t == nil || (t.status != "pass" && t.status != "skip") {
			c.out.WriteString(l.text)
		}
	}
	if e.Action == "" {
		fmt.Fprintf(c.out, "FAIL\t%s [no result: the go test output ended]\n", p.name)
	}
	p.lines = nil
	p.tests = nil
}

// noTestFiles reports whether go test said the package has no tests.
func (p *pkgState) noTestFiles() bool {
	for _, l := range p.lines {
		if l.test == "" && strings.Contains(l.text, "[no test files]") {
			return true
		}
	}
	return false
}

// packageSkipReason says why a whole package skipped; ok is false for a
// package with no test files, which is not worth a line.
func packageSkipReason(p *pkgState) (reason string, ok bool) {
	reason = noReason
	for _, l := range p.lines {
		if l.test != "" {
			continue
		}
		s := strings.TrimSpace(l.text)
		switch {
		case p.noTestFiles():
			return "", false
		case s == "", s == "PASS", s == "SKIP", strings.HasPrefix(s, "ok "), strings.HasPrefix(s, "?"):
		default:
			reason = normalizeReason(s)
		}
	}
	return reason, true
}

// logLine is the start of a t.Log, t.Error or t.Skip message in a test's
// output: "    file_test.go:12: message".
var logLine = regexp.MustCompile(`^\s*[^\s:]+\.go:\d+: ?(.*)$`)

// skipReason is the last message a test logged before it skipped (t.Skip
// logs its arguments; t.SkipNow logs nothing, and then the reason is the
// last message before, if any), with its continuation lines.
func skipReason(lines []string) string {
	start := -1
	var first string
	for i, l := range lines {
		if m := logLine.FindStringSubmatch(strings.TrimRight(l, "\n")); m != nil {
			start, first = i, m[1]
		}
	}
	if start < 0 {
		return noReason
	}
	parts := []string{first}
	for _, l := range lines[start+1:] {
		s := strings.TrimSpace(l)
		if s == "" {
			continue
		}
		// Continuation lines of a multi-line message are indented;
		// anything else (=== RUN of a subtest, --- SKIP) ends it.
		indented := strings.HasPrefix(l, " ") || strings.HasPrefix(l, "\t")
		if !indented || strings.HasPrefix(s, "=== ") || strings.HasPrefix(s, "--- ") {
			break
		}
		parts = append(parts, s)
	}
	return normalizeReason(strings.Join(parts, " "))
}

var fileLinePrefix = regexp.MustCompile(`^([^\s:]+\.go:\d+: ?)+`)

// normalizeReason makes reasons that say the same thing equal: no
// file:line prefix, single spaces.
func normalizeReason(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.TrimSpace(fileLinePrefix.ReplaceAllString(s, ""))
	if s == "" {
		return noReason
	}
	return s
}

// finish ends the input: packages that started and have no result failed
// (go test was killed, or the stream was cut), and so did builds that
// failed without a package saying so. It returns the summary.
func (c *collector) finish() *Summary {
	for _, name := range c.order {
		if p := c.pkgs[name]; !p.done {
			c.endPackage(p, event{Package: name})
		}
	}
	var unreported []string
	for ip := range c.buildFails {
		if !c.reported[ip] {
			unreported = append(unreported, ip)
		}
	}
	sort.Strings(unreported)
	for _, ip := range unreported {
		why := "build failed"
		if first := c.buildFails[ip]; first != "" {
			why += ": " + first
		}
		pkg, _, _ := strings.Cut(ip, " ")
		c.sum.Failed++
		c.sum.Failures = append(c.sum.Failures, Failure{Package: pkg, Reason: why})
	}
	c.out.Flush()
	for _, g := range c.skips {
		sort.Strings(g.Tests)
		c.sum.Skips = append(c.sum.Skips, *g)
	}
	sortSkips(c.sum.Skips)
	s := c.sum
	return &s
}

func sortSkips(gs []SkipGroup) {
	sort.Slice(gs, func(i, j int) bool {
		a, b := gs[i], gs[j]
		if a.Package != b.Package {
			return a.Package < b.Package
		}
		if a.Whole != b.Whole {
			return a.Whole
		}
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Reason < b.Reason
	})
}
