"""Lightning callbacks of qkvqa runs."""
