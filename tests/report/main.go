// Command report turns `go test -json` into the text go test prints and a
// summary of what the run covered: how many tests passed, failed and were
// skipped, and which tests were skipped and why. make test prints the
// summaries of its stages at its very end.
//
// Reading a test run (stream mode):
//
//	go test -json ./... | go run ./tests/report [-v] [-name unit] [-summary FILE]
//
// writes what go test would have printed to stdout: without -v as go test
// without -v does (the output of failed tests and of the packages, the
// per-package ok and FAIL lines), with -v every line (go test -v). The
// output of a package is printed when its result arrives. With -summary it
// writes the run's summary (JSON) to FILE. It exits 1 if a test or a
// package failed, a package did not build, or the input ended before a
// package that started had its result (go test killed): a failure is never
// lost on the way to the summary.
//
// Printing summaries (print mode):
//
//	go run ./tests/report -print [-fuzz LOG] [-e2e LOG] [-stage NAME=STATUS]... SUMMARY...
//
// prints a heading, one line per source (each summary file; the fuzz and
// e2e logs, counted from their last "N passed, N failed" line; each
// -stage without one of those, such as lint, counted as one check), the
// failures, one line per group of skipped tests (same package, same
// reason) and last, alone on its line, the totals:
//
//	N passed, N failed, N skipped
//
// A -stage whose exit status is not 0 but whose source counted no failure
// (or that has no source) counts as one failure, and so does a summary or
// log that is missing or unreadable: the totals say "0 failed" only when
// every stage passed. It exits 1 if anything failed.
//
//	go run ./tests/report -times SUMMARY...
//
// prints a Markdown table of how long each package's tests ran (go
// test's figure for the package: the test binary's run, not its build),
// longest first, as docs/testing.md keeps it.
//
//	go run ./tests/report -failed SUMMARY...
//
// prints one line per failed test ("PACKAGE TEST") or package ("PACKAGE
// (reason)"); scripts/flake.sh uses it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// stageFlags collects -stage NAME=STATUS in order.
type stageFlags []stage

type stage struct {
	name   string
	status int
}

func (s *stageFlags) String() string {
	parts := make([]string, len(*s))
	for i, st := range *s {
		parts[i] = st.name + "=" + strconv.Itoa(st.status)
	}
	return strings.Join(parts, ",")
}

func (s *stageFlags) Set(v string) error {
	name, status, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=STATUS, got %q", v)
	}
	n, err := strconv.Atoi(status)
	if err != nil {
		return fmt.Errorf("want NAME=STATUS with a number, got %q", v)
	}
	*s = append(*s, stage{name: name, status: n})
	return nil
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		printMode  = fs.Bool("print", false, "print the summary files given as arguments")
		failedMode = fs.Bool("failed", false, "print the failed tests of the summary files given as arguments, one a line")
		timesMode  = fs.Bool("times", false, "print a table of each package's time from the summary files given as arguments")
		verbose    = fs.Bool("v", false, "stream mode: print every line of output, as go test -v does")
		name       = fs.String("name", "unit", "stream mode: the name of this run in the summary")
		summary    = fs.String("summary", "", "stream mode: write the summary (JSON) to this file")
		fuzzLog    = fs.String("fuzz", "", "print mode: scripts/fuzz.sh's output")
		e2eLog     = fs.String("e2e", "", "print mode: tests/e2e/run.sh's output")
		stages     stageFlags
	)
	fs.Var(&stages, "stage", "print mode: NAME=STATUS, a stage's exit status (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case *printMode && *failedMode:
		fmt.Fprintln(stderr, "report: -print and -failed do not go together")
		return 2
	case *printMode:
		return printSummaries(stdout, stderr, fs.Args(), *fuzzLog, *e2eLog, stages)
	case *failedMode:
		return printFailed(stdout, stderr, fs.Args())
	case *timesMode:
		return printTimes(stdout, stderr, fs.Args())
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "report: stream mode reads go test -json on stdin and takes no arguments (got %q)\n", fs.Args())
		return 2
	}
	c := newCollector(stdout, *verbose)
	err := c.read(stdin)
	s := c.finish()
	s.Name = *name
	status := 0
	if err != nil {
		fmt.Fprintf(stderr, "report: reading go test -json: %v\n", err)
		status = 1
	}
	if !c.sawEvents {
		fmt.Fprintln(stderr, "report: no go test -json events on stdin")
		status = 1
	}
	if s.Failed > 0 {
		status = 1
	}
	if *summary != "" {
		if err := writeSummary(*summary, s); err != nil {
			fmt.Fprintf(stderr, "report: %v\n", err)
			status = 1
		}
	}
	return status
}

func writeSummary(path string, s *Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if err := os.WriteFile(path, b, 0o644); err != nil { // #nosec G306 -- a test report, readable like the logs next to it
		return fmt.Errorf("writing the summary: %w", err)
	}
	return nil
}

func readSummary(path string) (*Summary, error) {
	b, err := os.ReadFile(path) // #nosec G304 -- a file named on the command line
	if err != nil {
		return nil, err
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

// printFailed prints the failures of the summary files, one a line.
func printFailed(stdout, stderr io.Writer, paths []string) int {
	status := 0
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	for _, p := range paths {
		s, err := readSummary(p)
		if err != nil {
			fmt.Fprintf(stderr, "report: %v\n", err)
			fmt.Fprintf(w, "%s (no summary: %v)\n", p, err)
			status = 1
			continue
		}
		for _, f := range s.Failures {
			if f.Test != "" {
				fmt.Fprintf(w, "%s %s\n", f.Package, f.Test)
			} else {
				fmt.Fprintf(w, "%s (%s)\n", f.Package, f.Reason)
			}
		}
		if s.Failed > 0 {
			status = 1
		}
	}
	return status
}

// printTimes prints each package's time from the summary files, longest
// first, as a Markdown table; a package in several files gets a column
// each (a quiet and a loaded run side by side).
func printTimes(stdout, stderr io.Writer, paths []string) int {
	secs := map[string][]string{}
	key := map[string]float64{} // the package's time in the first file that has it
	var total []float64
	for i, p := range paths {
		s, err := readSummary(p)
		if err != nil {
			fmt.Fprintf(stderr, "report: %v\n", err)
			return 1
		}
		total = append(total, 0)
		for _, t := range s.Packages {
			if secs[t.Package] == nil {
				secs[t.Package] = make([]string, len(paths))
				key[t.Package] = t.Seconds
			}
			v := strconv.FormatFloat(t.Seconds, 'f', 0, 64)
			if t.Result != "pass" {
				v += " (" + t.Result + ")"
			}
			secs[t.Package][i] = v
			total[i] += t.Seconds
		}
	}
	pkgs := make([]string, 0, len(secs))
	for p := range secs {
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool {
		if a, b := key[pkgs[i]], key[pkgs[j]]; a != b {
			return a > b
		}
		return pkgs[i] < pkgs[j]
	})
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	head, rule := "| package |", "|---|"
	for _, p := range paths {
		head += " " + strings.TrimSuffix(filepath.Base(p), ".json") + " (s) |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	for _, p := range pkgs {
		fmt.Fprintf(w, "| %s | %s |\n", p, strings.Join(secs[p], " | "))
	}
	row := "| all packages, added up |"
	for _, t := range total {
		row += " " + strconv.FormatFloat(t, 'f', 0, 64) + " |"
	}
	fmt.Fprintln(w, row)
	return 0
}
