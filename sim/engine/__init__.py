"""The discrete-event engine and what feeds it (programs) and reads it (metrics)."""
