"""Answer generation (method.md section 5): prompts, transformers backends and the out-of-process vLLM backend.

Entry points: `qkvqa.generation.backends.build_generator(spec, generation_cfg) -> Generator` and the
request/prompt types in `qkvqa.generation.prompts`. This package stays import-light (the vLLM
worker imports it from another environment with only the standard library).
"""
