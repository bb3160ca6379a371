package api

import "time"

// Housekeep runs the periodic jobs as if the time were now.
func Housekeep(s *Server, now time.Time) {
	s.expireSessions(now)
	s.collectTasks(now)
}
