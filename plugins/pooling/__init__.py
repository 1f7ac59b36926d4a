"""Pooling (embeddings): the checkpoint's pooling choice, the pooler, and an encoder runner for BERT-family models."""
