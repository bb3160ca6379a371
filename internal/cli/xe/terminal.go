package xe

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Terminal is a terminal the console can put in raw mode.
type Terminal interface {
	// Raw switches to raw mode and returns how to switch back.
	Raw() (restore func(), err error)
}

// stdinTerminal is the process's standard input.
type stdinTerminal struct{}

func (stdinTerminal) Raw() (func(), error) {
	fd := int(os.Stdin.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	raw := *old
	// Everything the user types goes to the console, Ctrl-C included.
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil // restoring on the way out: nothing better to do
}

// isTerminal reports whether a file is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressBar draws a transfer's progress on a terminal line.
type progressBar struct {
	w     io.Writer
	total int64 // -1: unknown
	start time.Time
	last  time.Time
	done  int64
}

func newProgressBar(w io.Writer, total int64) *progressBar {
	now := time.Now()
	return &progressBar{w: w, total: total, start: now, last: now.Add(-time.Second)}
}

func (p *progressBar) update(done int64) {
	p.done = done
	if time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.draw()
}

func (p *progressBar) draw() {
	rate := float64(p.done) / max(time.Since(p.start).Seconds(), 1e-3)
	if p.total > 0 {
		frac := min(float64(p.done)/float64(p.total), 1)
		const width = 40
		n := int(frac * width)
		fmt.Fprintf(p.w, "\r[%s%s] %3d%% %s of %s, %s/s ", strings.Repeat("#", n), strings.Repeat(" ", width-n),
			int(frac*100), size(p.done), size(p.total), size(int64(rate)))
		return
	}
	fmt.Fprintf(p.w, "\r%s, %s/s ", size(p.done), size(int64(rate)))
}

func (p *progressBar) finish() {
	p.draw()
	fmt.Fprintln(p.w)
}

// size shows a byte count with a binary unit.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n)/unit, 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[u])
}
