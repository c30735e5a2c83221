"""`make demo`: the whole method on the synthetic world, end to end, with a comparison table and plots."""
