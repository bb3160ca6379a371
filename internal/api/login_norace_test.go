//go:build !race

package api_test

// raceEnabled: the race detector slows PBKDF2 about tenfold, so timing
// tests pick a lower work factor under it.
const raceEnabled = false
