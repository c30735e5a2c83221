"""The Question-Focused Filter: the question-focused Q-Former (`model`), scoring and reranking (`scoring`), loading (`builder`, `lavis`)."""
