"""qkvqa: question-focused filtering for knowledge-based VQA, as a Lightning experiment framework."""

__version__ = "0.1.0"
