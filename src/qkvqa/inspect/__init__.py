"""`qkvqa inspect`: a static web site of an evaluation run's per-question traces, for error analysis."""
