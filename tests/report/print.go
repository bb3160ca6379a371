package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// source is one line of the printed summary: a go test run, a log with
// counts, or a stage that has neither (one check).
type source struct {
	name                    string
	passed, failed, skipped int
	// kind: "go test" (passed, failed, skipped), "log" (passed, failed),
	// "stage" (one check, passed or failed).
	kind   string
	status int // a stage's exit status
}

func (s *source) String() string {
	switch s.kind {
	case "go test":
		return fmt.Sprintf("%s: %d passed, %d failed, %d skipped", s.name, s.passed, s.failed, s.skipped)
	case "log":
		return fmt.Sprintf("%s: %d passed, %d failed", s.name, s.passed, s.failed)
	}
	if s.failed > 0 {
		return fmt.Sprintf("%s: FAIL (exit status %d)", s.name, s.status)
	}
	return s.name + ": ok"
}

// At most this many failures and skipped test names are printed.
const (
	maxFailureLines = 40
	maxSkipNames    = 3
	maxReasonLen    = 200
)

// printSummaries is print mode: see the package comment.
func printSummaries(stdout, stderr io.Writer, paths []string, fuzzLog, e2eLog string, stages stageFlags) int {
	if len(paths) == 0 && fuzzLog == "" && e2eLog == "" && len(stages) == 0 {
		fmt.Fprintln(stderr, "report: -print needs summary files, -fuzz, -e2e or -stage")
		return 2
	}
	var (
		sources  []*source
		failures []string
		skips    = map[skipKey]*SkipGroup{}
	)
	for _, p := range paths {
		s, err := readSummary(p)
		if err != nil {
			name := strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
			sources = append(sources, &source{name: name, kind: "go test", failed: 1})
			failures = append(failures, fmt.Sprintf("FAIL %s: no summary (%v)", name, err))
			continue
		}
		sources = append(sources, &source{name: s.Name, kind: "go test", passed: s.Passed, failed: s.Failed, skipped: s.Skipped})
		for _, f := range s.Failures {
			line := "FAIL " + f.Package
			if f.Test != "" {
				line += " " + f.Test
			}
			if f.Reason != "" {
				line += ": " + f.Reason
			}
			failures = append(failures, line)
		}
		// A summary that counts failures it does not name (written by
		// hand, or by another tool) still shows them.
		if s.Failed > 0 && len(s.Failures) == 0 {
			failures = append(failures, fmt.Sprintf("FAIL %s: %d failed", s.Name, s.Failed))
		}
		for _, g := range s.Skips {
			k := skipKey{g.Package, normalizeReason(g.Reason)}
			m := skips[k]
			if m == nil {
				m = &SkipGroup{Package: k.pkg, Reason: k.reason}
				skips[k] = m
			}
			m.Count += g.Count
			m.Tests = append(m.Tests, g.Tests...)
			m.Whole = m.Whole || g.Whole
		}
	}
	for _, l := range []struct{ name, path string }{{"fuzz", fuzzLog}, {"e2e", e2eLog}} {
		if l.path == "" {
			continue
		}
		src, lines := readCountsLog(l.name, l.path)
		sources = append(sources, src)
		failures = append(failures, lines...)
	}
	sources = applyStages(sources, stages, &failures)

	var passed, failed, skipped int
	for _, s := range sources {
		passed += s.passed
		failed += s.failed
		skipped += s.skipped
	}
	groups := make([]SkipGroup, 0, len(skips))
	for _, g := range skips {
		sort.Strings(g.Tests)
		groups = append(groups, *g)
	}
	sortSkips(groups)

	w := bufio.NewWriter(stdout)
	defer w.Flush()
	fmt.Fprintln(w, "=== test summary")
	for _, s := range sources {
		fmt.Fprintln(w, s)
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "--- failures (%d)\n", len(failures))
		for i, f := range failures {
			if i == maxFailureLines {
				fmt.Fprintf(w, "... and %d more (see the output above)\n", len(failures)-i)
				break
			}
			fmt.Fprintln(w, f)
		}
	}
	if len(groups) > 0 {
		fmt.Fprintf(w, "--- skipped: what this run did not cover (%s in %s)\n", plural(skipped, "test"), plural(len(groups), "group"))
		for _, g := range groups {
			fmt.Fprintln(w, skipLine(g))
		}
	}
	// The closing line, alone, in this form: the CI harness reads it.
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 {
		return 1
	}
	return 0
}

// skipLine is one group of skipped tests:
//
//	SKIP toolstackd/tests/network (7 tests): needs root (TestA, TestB, TestC and 4 more)
func skipLine(g SkipGroup) string {
	reason := g.Reason
	if r := []rune(reason); len(r) > maxReasonLen {
		reason = string(r[:maxReasonLen]) + "..."
	}
	if g.Whole && g.Count == 0 {
		return fmt.Sprintf("SKIP %s (whole package): %s", g.Package, reason)
	}
	what := plural(g.Count, "test")
	names := g.Tests
	more := ""
	if len(names) > maxSkipNames {
		more = fmt.Sprintf(" and %d more", g.Count-maxSkipNames)
		names = names[:maxSkipNames]
	}
	line := fmt.Sprintf("SKIP %s (%s): %s", g.Package, what, reason)
	if len(names) > 0 {
		line += " (" + strings.Join(names, ", ") + more + ")"
	}
	return line
}

var (
	countsLine = regexp.MustCompile(`^(\d+) passed, (\d+) failed$`)
	// Lines of the logs that name what failed: scripts/fuzz.sh's
	// "FAIL fuzz PKG NAME", tests/e2e/run.sh's per-suite counts.
	logFailure = regexp.MustCompile(`^(FAIL fuzz .*|e2e suite \S+: \d+ passed, [1-9]\d* failed)$`)
)

// readCountsLog counts a log from its last "N passed, N failed" line; a
// log that is missing or has no such line counts as one failure.
func readCountsLog(name, path string) (*source, []string) {
	src := &source{name: name, kind: "log"}
	f, err := os.Open(path) // #nosec G304 -- a file named on the command line
	if err != nil {
		src.failed = 1
		return src, []string{fmt.Sprintf("FAIL %s: no log (%v)", name, err)}
	}
	defer f.Close()
	var failures []string
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if m := countsLine.FindStringSubmatch(line); m != nil {
			src.passed, _ = strconv.Atoi(m[1])
			src.failed, _ = strconv.Atoi(m[2])
			found = true
		}
		if logFailure.MatchString(line) {
			if !strings.HasPrefix(line, "FAIL ") {
				line = "FAIL " + line
			}
			failures = append(failures, line)
		}
	}
	if err := sc.Err(); err != nil {
		src.failed++
		failures = append(failures, fmt.Sprintf("FAIL %s: reading %s: %v", name, path, err))
	} else if !found {
		src.failed++
		failures = append(failures, fmt.Sprintf("FAIL %s: no \"N passed, N failed\" line in %s", name, path))
	}
	return src, failures
}

// applyStages puts the stages' sources first, in stage order, adds a
// source for each stage that has none (one check) and counts a failure for
// a stage that failed without counting one.
func applyStages(sources []*source, stages stageFlags, failures *[]string) []*source {
	var out []*source
	used := map[*source]bool{}
	for _, st := range stages {
		var mine []*source
		for _, s := range sources {
			if s.name == st.name && !used[s] {
				mine = append(mine, s)
			}
		}
		if len(mine) == 0 {
			s := &source{name: st.name, kind: "stage", status: st.status}
			if st.status == 0 {
				s.passed = 1
			} else {
				s.failed = 1
				*failures = append(*failures, fmt.Sprintf("FAIL %s (exit status %d)", st.name, st.status))
			}
			out = append(out, s)
			continue
		}
		counted := 0
		for _, s := range mine {
			counted += s.failed
			used[s] = true
		}
		if st.status != 0 && counted == 0 {
			mine[0].failed++
			*failures = append(*failures, fmt.Sprintf("FAIL %s (exit status %d, no failure counted)", st.name, st.status))
		}
		out = append(out, mine...)
	}
	for _, s := range sources {
		if !used[s] {
			out = append(out, s)
		}
	}
	return out
}

// plural is "1 test", "2 tests".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
