"""CDA (method.md section 4): article selection, sentence-preserving chunks, chunk reranking and quotas.

Public entry points (import them from their modules; this package stays import-light for the registry):
`qkvqa.cda.select.select_context` / `ContextSelector`, `qkvqa.cda.chunker.Chunker`,
`qkvqa.cda.splitter.SentenceSplitter` (kind `spacy_sentencizer`), `qkvqa.cda.reranker` (kind `bge_reranker`).
"""
