// Package nsrun runs a function inside a network namespace.
//
// A Linux thread, not a process, is in a network namespace, and a Go
// goroutine may move between threads at any moment. Run therefore starts
// a goroutine, locks it to its thread, moves the thread into the namespace
// named by a path (a bind mount such as /run/netns/NAME), runs the
// function there and moves the thread back. What the function makes there
// stays there: a socket it opens keeps sending and receiving in that
// namespace wherever it is used later, which is how the daemon's listeners
// and a test's sockets come to live in another namespace.
//
// If the thread cannot be moved back it is left locked, so that the
// runtime ends it with its goroutine rather than running other goroutines
// in the wrong namespace.
package nsrun

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Run runs f on a thread in the network namespace at path (the caller's
// own, on the caller's goroutine, when path is "") and returns f's error,
// or why the namespace could not be entered (f then does not run).
func Run(path string, f func() error) error {
	if path == "" {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer func() { _ = orig.Close() }()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network namespace %s: %w", path, err)
			return
		}
		defer func() { _ = target.Close() }()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering network namespace %s: %w", path, err)
			return
		}
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
