package api

// EndSessionTasks runs the end-of-session task sweep for a session, as if
// it had just ended (the session must be out of the table for its tasks
// to stay gone; the sweep itself does not need that).
func EndSessionTasks(s *Server, session string) { s.sessionEndedTasks(session) }
