"""Stage 1, retrieval: encoders, resumable embedding shards, faiss indexes with manifests, retrieval results."""
