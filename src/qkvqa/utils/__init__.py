"""Small shared helpers: rank-aware logging, progress bars, atomic file writes."""
