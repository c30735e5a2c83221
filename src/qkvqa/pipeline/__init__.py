"""The KB-VQA pipeline per question: retrieved articles -> filter -> CDA -> generation, plus its outputs."""
