"""Reconstruction and inference attacks on what the server sees."""
